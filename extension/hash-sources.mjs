// The fingerprint of what the committed build is made from: SHA-256 over src/ and style/
// (each file's path relative to extension/, a NUL, its bytes, a NUL; files in sorted order).
// `npm run build` records it in ../pwkernel/labextension/sources.json; the Python tests
// recompute it to tell a stale committed build (tests/notebook/test_labextension.py).
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const ROOTS = ['src', 'style'];

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap(e =>
    e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]
  );
}

const hash = createHash('sha256');
const paths = ROOTS.flatMap(files).map(p => p.split('\\').join('/')).sort();
for (const path of paths) {
  hash.update(path + '\0');
  hash.update(readFileSync(path));
  hash.update('\0');
}
const out = process.argv[2];
const record = { sha256: hash.digest('hex'), files: paths };
writeFileSync(out, JSON.stringify(record, null, 1) + '\n');
console.log(`pwkernel: recorded the hash of ${paths.length} source files in ${out}`);
