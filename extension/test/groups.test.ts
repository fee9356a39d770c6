/**
 * The sidebar's device cells: one per device while they fit, runs of devices beyond.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { deviceCells, deviceGroups, MOST_CELLS } from '../src/groups';

test('a cell per device while the devices fit', () => {
  const ids = [4, 5, 6, 7];
  const facts = new Map([[5, { utilization: 0.5, busy: true, memory: 32 }]]);
  const cells = deviceCells(ids, facts);
  assert.deepEqual(cells.map(c => c.label), ['4', '5', '6', '7']);
  assert.deepEqual(cells[1], { label: '5', devices: [5], utilization: 0.5, busy: true, memory: 32 });
  assert.equal(cells[0].busy, false);
});

test('a simulated pod of 2048 devices gets 64 cells of 32, with their totals', () => {
  const ids = Array.from({ length: 2048 }, (_, i) => i);
  const facts = new Map(ids.map(i => [i, { utilization: i < 16 ? 1 : 0, memory: 10 }]));
  const cells = deviceCells(ids, facts);
  assert.equal(cells.length, MOST_CELLS);
  assert.equal(cells[0].label, '0-31');
  assert.equal(cells[63].label, '2016-2047');
  assert.equal(cells[0].utilization, 0.5); // 16 of its 32 devices busy the whole time
  assert.equal(cells[0].memory, 320);
  assert.equal(cells[1].utilization, 0);
});

test('runs cover every device once, in order, whatever the count', () => {
  for (const n of [1, 63, 64, 65, 100, 1000, 4096]) {
    const ids = Array.from({ length: n }, (_, i) => 1000 + i);
    const groups = deviceGroups(ids);
    assert.ok(groups.length <= MOST_CELLS, `${n} devices: ${groups.length} cells`);
    assert.deepEqual(groups.flat(), ids);
  }
  assert.deepEqual(deviceGroups([], 8), []);
});
