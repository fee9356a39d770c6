/**
 * The sidebar's message handling: validation of every kernel reply, and the state updates.
 * Run with `npm test` (tsc to CommonJS, then `node --test`).
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  applyReply,
  cancelRequest,
  controllerText,
  formatBytes,
  initialState,
  parseReply,
  parseStatus,
  policyRequest,
  PROTOCOL,
  ProtocolError,
  ROW_MODES,
  sliceMesh,
  traceRequest,
  withConnection
} from '../src/protocol';

/** A status `data` shaped like pwkernel.notebook.comm.status_message's. */
function statusData(): Record<string, any> {
  return {
    islands: [
      {
        id: 0,
        platform: 'cpu',
        devices: [0, 1],
        running: 1,
        queued: 2,
        memory_reserved: { '0': 0, '1': 0 },
        programs_running: 1,
        programs_queued: 0
      }
    ],
    slices: ['VirtualSlice(id=0, x=2, island=0, devices=[0, 1])'],
    programs: ["ProgramRun(id=4, name='f', client='alice', 2 nodes left)"],
    memory: { '0': 1024, '1': 0 },
    policy: 'fifo',
    dispatch: 'parallel',
    closed: false,
    devices: [
      { id: 0, island: 0, memory: 1024, utilization: 0.5, busy: true },
      { id: 1, island: 0, memory: 0, utilization: 0, busy: false }
    ],
    runs: [
      { id: 4, name: 'f', client: 'alice', state: 'running', islands: [0], running_on: [0] }
    ],
    named_slices: [{ name: 's0', island: 0, devices: [0, 1], shape: [2] }],
    protocol: PROTOCOL
  };
}

test('a full status reply validates and keeps what the panel shows', () => {
  const reply = parseReply({ type: 'status', data: statusData() });
  assert.equal(reply.type, 'status');
  if (reply.type !== 'status') return;
  assert.equal(reply.data.closed, false);
  assert.deepEqual(reply.data.islands[0].devices, [0, 1]);
  assert.equal(reply.data.devices[0].utilization, 0.5);
  assert.equal(reply.data.runs[0].state, 'running');
  assert.equal(reply.data.named_slices[0].name, 's0');
  assert.equal(reply.data.policy, 'fifo');
});

test('slices show their axes and axis types; the header says when nothing started', () => {
  const data = statusData();
  data.named_slices = [
    { name: 's', island: 0, devices: [0, 1, 2, 3], shape: [2, 2], axis_names: ['x', 'y'],
      axis_types: ['explicit', 'explicit'] },
    { name: '#3', island: 1, devices: [4, 5], shape: [2], axis_names: ['x'],
      axis_types: ['auto'] },
    { name: 'old', island: 0, devices: [0], shape: [1] }
  ];
  const parsed = parseStatus(data);
  assert.deepEqual(parsed.named_slices.map(sliceMesh), [
    'x=2 × y=2 (explicit)', 'x=2 (auto)', '1'
  ]);
  assert.equal(controllerText(parsed), 'connected');
  const waiting = parseStatus({ ...statusData(), started: false, islands: [], devices: [] });
  assert.equal(controllerText(waiting), 'controller not started yet');
  assert.equal(controllerText(parseStatus({ closed: true, protocol: PROTOCOL })),
    'controller closed');
  data.named_slices[0].axis_types = [3];
  assert.throws(() => parseStatus(data), /field 'axis_types' must be a list of strings/);
});

test('a closed controller validates to empty lists', () => {
  const data = parseStatus({ closed: true, protocol: PROTOCOL });
  assert.equal(data.closed, true);
  assert.deepEqual(data.islands, []);
  assert.deepEqual(data.runs, []);
});

test('bad status fields are rejected with the field path and what was expected', () => {
  const cases: [(d: Record<string, any>) => void, RegExp][] = [
    [d => (d.islands[0].devices = ['a']), /status\.data\.islands\[0\]: field 'devices' must be a list of ints/],
    [d => (d.devices[1].utilization = 1.5), /utilization must be in \[0, 1\]; got 1\.5/],
    [d => (d.runs[0].state = 'sleeping'), /field 'state' must be 'running' or 'queued'; got "sleeping"/],
    [d => delete d.named_slices, /field 'named_slices' must be a list; got undefined/],
    [d => (d.runs = [3]), /status\.data\.runs\[0\] must be an object; got 3/],
    [d => (d.protocol = PROTOCOL + 1), /protocol 2, this sidebar 1/],
    [d => (d.policy = 7), /field 'policy' must be a string; got 7/]
  ];
  for (const [spoil, message] of cases) {
    const data = statusData();
    spoil(data);
    assert.throws(() => parseReply({ type: 'status', data }), (e: unknown) => {
      assert.ok(e instanceof ProtocolError);
      assert.match((e as Error).message, message);
      return true;
    });
  }
});

test('replies that are not protocol objects are rejected', () => {
  assert.throws(() => parseReply(null), /expected a JSON object with a string 'type'/);
  assert.throws(() => parseReply([1]), /expected a JSON object/);
  assert.throws(() => parseReply({ type: 'launch' }), /unknown reply type "launch"/);
  assert.throws(() => parseReply({ type: 'status', data: 3 }), /status.data must be an object/);
  assert.throws(() => parseReply({ type: 'trace', events: 2 }), /field 'path' must be a string/);
  assert.throws(() => parseReply({ type: 'cancel', run: 1, cancelled: 'x' }), /'cancelled'/);
  assert.throws(() => parseReply({ type: 'error', error: 'x', id: [1] }), /'id' must be an int/);
});

test('action replies validate and carry the request id', () => {
  assert.deepEqual(parseReply({ type: 'policy', policy: 'share', id: 3 }), {
    type: 'policy',
    policy: 'share',
    id: 3
  });
  assert.deepEqual(parseReply({ type: 'cancel', run: 4, cancelled: 2 }), {
    type: 'cancel',
    run: 4,
    cancelled: 2
  });
  assert.deepEqual(parseReply({ type: 'error', error: 'bad', request: 'cancel', id: 9 }), {
    type: 'error',
    error: 'bad',
    request: 'cancel',
    id: 9
  });
});

test('trace requests carry rows the kernel accepts, and refuse others', () => {
  for (const rows of ROW_MODES) {
    assert.deepEqual(traceRequest(rows), { type: 'trace', rows });
  }
  for (const bad of ['', 'devices', 'ISLAND', 'slice']) {
    assert.throws(() => traceRequest(bad), (e: unknown) => {
      assert.ok(e instanceof ProtocolError);
      assert.match((e as Error).message, /must be one of auto, device, host, island; got "/);
      return true;
    });
  }
  const reply = parseReply({ type: 'trace', path: '/tmp/t.json', events: 3, rows: 'host' });
  assert.deepEqual(reply, { type: 'trace', path: '/tmp/t.json', events: 3, rows: 'host' });
  assert.match(applyReply(initialState(), reply).message, /3 events, rows: host\): \/tmp\/t\.json$/);
});

test('state: status replies connect and replace the snapshot', () => {
  let s = withConnection(initialState(), 'connecting', 'Pathways (JAX)');
  assert.equal(s.connection, 'connecting');
  assert.equal(s.status, null);
  s = applyReply(s, parseReply({ type: 'status', data: statusData() }));
  assert.equal(s.connection, 'connected');
  assert.equal(s.kernelName, 'Pathways (JAX)');
  assert.equal(s.status?.runs.length, 1);
  const next = statusData();
  next.runs = [];
  s = applyReply(s, parseReply({ type: 'status', data: next }));
  assert.equal(s.status?.runs.length, 0);
});

test('state: actions update policy, messages and the trace path', () => {
  let s = applyReply(initialState(), parseReply({ type: 'status', data: statusData() }));
  s = applyReply(s, parseReply({ type: 'policy', policy: 'share' }));
  assert.equal(s.status?.policy, 'share');
  assert.equal(s.error, false);
  s = applyReply(s, parseReply({ type: 'trace', path: '/tmp/t.json', events: 12 }));
  assert.equal(s.tracePath, '/tmp/t.json');
  assert.match(s.message, /12 events.*\/tmp\/t\.json/);
  s = applyReply(s, parseReply({ type: 'error', error: 'no active program with run id 9' }));
  assert.equal(s.error, true);
  assert.match(s.message, /run id 9/);
  s = applyReply(s, parseReply({ type: 'cancel', run: 4, cancelled: 2 }));
  assert.equal(s.error, false);
  assert.match(s.message, /run 4: 2 computation/);
});

test('state: losing the connection forgets the snapshot', () => {
  let s = applyReply(initialState(), parseReply({ type: 'status', data: statusData() }));
  s = withConnection(s, 'restarting');
  assert.equal(s.status, null);
  assert.equal(s.connection, 'restarting');
  s = withConnection(s, 'not-loaded', 'Python 3');
  assert.equal(s.kernelName, 'Python 3');
});

test('requests are checked before they are sent', () => {
  assert.deepEqual(policyRequest('priority'), { type: 'policy', policy: 'priority' });
  assert.throws(() => policyRequest('lifo'), /one of fifo, priority, share; got "lifo"/);
  assert.deepEqual(cancelRequest(3), { type: 'cancel', run: 3 });
  assert.throws(() => cancelRequest(-1), /integer >= 0/);
  assert.throws(() => cancelRequest(1.5), /integer >= 0/);
});

test('bytes are shown in binary units', () => {
  assert.equal(formatBytes(0), '0 B');
  assert.equal(formatBytes(512), '512 B');
  assert.equal(formatBytes(1536), '1.5 KiB');
  assert.equal(formatBytes(64 * 1024 * 1024), '64 MiB');
});
