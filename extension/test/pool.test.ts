/**
 * A shared device pool in the status (pwkernel.notebook.usage.pool_part's shape): its
 * validation, and the other tenants' busy fractions per device cell.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { cellOthers } from '../src/groups';
import { parseStatus, PROTOCOL } from '../src/protocol';

function pooled(): Record<string, any> {
  return {
    islands: [{ id: 0, platform: 'cpu', devices: [0, 1], running: 0, queued: 0,
      programs_running: 0, programs_queued: 0 }],
    devices: [
      { id: 0, island: 0, memory: 0, utilization: 0.1, busy: false, others: { bob: 0.5 } },
      { id: 1, island: 0, memory: 0, utilization: 0, busy: false, others: {} }
    ],
    runs: [], named_slices: [], policy: 'fifo', dispatch: 'parallel', closed: false,
    protocol: PROTOCOL,
    pool: {
      name: 'class',
      tenants: [
        { name: 'me:1', me: true, color: '', queued: 0, running: 0, share: 0.25,
          device_seconds: 1, bytes: 16, devices: [0] },
        { name: 'bob', me: false, color: '#E69F00', queued: 2, running: 1, share: 0.75,
          device_seconds: 3, bytes: 0, devices: [0, 1] }
      ],
      recent: [{ tenant: 'bob', client: 'bob/default', name: 'psum', island: 0,
        devices: [0, 1], ago: 0.2, duration: 0.001 }]
    }
  };
}

test('a pool status keeps its tenants, their colours and the others\' recent work', () => {
  const data = parseStatus(pooled());
  assert.equal(data.pool?.name, 'class');
  assert.deepEqual(data.pool?.tenants.map(t => [t.name, t.me, t.color]), [
    ['me:1', true, ''], ['bob', false, '#E69F00']
  ]);
  assert.equal(data.pool?.recent[0].client, 'bob/default');
  assert.deepEqual(data.devices[0].others, { bob: 0.5 });
});

test('a status without a pool has pool null and devices without others', () => {
  const plain = pooled();
  delete plain.pool;
  for (const d of plain.devices) delete d.others;
  const data = parseStatus(plain);
  assert.equal(data.pool, null);
  assert.deepEqual(data.devices[1].others, {});
});

test('a bad pool is refused with the field and what was expected', () => {
  const cases: [(d: Record<string, any>) => void, RegExp][] = [
    [d => (d.pool.tenants[1].color = 'red;x:y'), /tenants\[1\]: field 'color' must be '#rrggbb'/],
    [d => (d.pool.tenants[0].share = 2), /field 'share' must be a number in \[0, 1\]/],
    [d => (d.pool.recent = {}), /field 'recent' must be a list/],
    [d => (d.devices[0].others = { bob: 'busy' }), /others must map tenant names to numbers/],
    [d => (d.pool = 3), /field 'pool' must be an object or null/]
  ];
  for (const [spoil, message] of cases) {
    const data = pooled();
    spoil(data);
    assert.throws(() => parseStatus(data), message);
  }
});

test('a cell of several devices shows each other tenant\'s mean busy fraction', () => {
  const facts = new Map<number, { others?: Record<string, number> }>([
    [0, { others: { bob: 0.5, carol: 1 } }],
    [1, { others: { bob: 0.5 } }],
    [2, {}]
  ]);
  assert.deepEqual(cellOthers([0, 1], facts), [['bob', 0.5], ['carol', 0.5]]);
  assert.deepEqual(cellOthers([2], facts), []);
});
