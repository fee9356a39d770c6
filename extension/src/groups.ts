/**
 * Device cells of the sidebar at any scale: a cell per device while an island's devices fit,
 * else a cell per run of consecutive devices (a simulated pod has thousands), with their
 * mean utilization, whether any is busy, and the bytes they hold together.
 */

/** At most this many cells per island. */
export const MOST_CELLS = 64;

/** What a cell shows: one device, or a run of them. */
export interface DeviceCell {
  label: string;
  devices: number[];
  utilization: number;
  busy: boolean;
  memory: number;
}

interface DeviceFacts {
  utilization?: number;
  busy?: boolean;
  memory?: number;
}

/** Split `ids` (in order) into at most `most` runs of equal length (the last may be shorter). */
export function deviceGroups(ids: number[], most: number = MOST_CELLS): number[][] {
  const size = Math.max(1, Math.ceil(ids.length / Math.max(1, most)));
  const out: number[][] = [];
  for (let i = 0; i < ids.length; i += size) {
    out.push(ids.slice(i, i + size));
  }
  return out;
}

/** The cells of one island's devices, from each device's facts (missing: idle, empty). */
export function deviceCells(
  ids: number[],
  facts: Map<number, DeviceFacts>,
  most: number = MOST_CELLS
): DeviceCell[] {
  return deviceGroups(ids, most).map(group => {
    let utilization = 0;
    let busy = false;
    let memory = 0;
    for (const id of group) {
      const d = facts.get(id);
      utilization += d?.utilization ?? 0;
      busy = busy || (d?.busy ?? false);
      memory += d?.memory ?? 0;
    }
    const label =
      group.length === 1 ? `${group[0]}` : `${group[0]}-${group[group.length - 1]}`;
    return { label, devices: group, utilization: utilization / group.length, busy, memory };
  });
}

/** Each other tenant's mean busy fraction over a cell's devices (a shared pool's; a device
 * without `others` counts as idle for every tenant), largest first. */
export function cellOthers(
  devices: number[],
  facts: Map<number, { others?: Record<string, number> }>
): [string, number][] {
  const sums = new Map<string, number>();
  for (const id of devices) {
    for (const [tenant, f] of Object.entries(facts.get(id)?.others ?? {})) {
      sums.set(tenant, (sums.get(tenant) ?? 0) + f);
    }
  }
  const n = Math.max(1, devices.length);
  return [...sums].map(([t, s]): [string, number] => [t, s / n]).sort((a, b) => b[1] - a[1]);
}
