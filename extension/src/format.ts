/**
 * How the sidebar words what the kernel reports: byte counts, slice meshes, the controller's
 * state. Pure functions (no JupyterLab), re-exported by protocol.ts and unit-tested with it.
 */

import type { SliceInfo, StatusData } from './protocol';

/** Format bytes for a device cell: 0 B, 512 B, 1.5 KiB, 3.2 MiB, ... */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

/** How the sidebar names a slice's mesh: `x=4 × y=2 (explicit)`, or `4×2` from an old kernel. */
export function sliceMesh(sl: SliceInfo): string {
  if (sl.axis_names.length !== sl.shape.length) {
    return sl.shape.join('×');
  }
  const dims = sl.shape.map((n, i) => `${sl.axis_names[i]}=${n}`).join(' × ');
  const types = [...new Set(sl.axis_types)];
  const kind = types.length === 1 ? types[0] : sl.axis_types.join(',');
  return kind ? `${dims} (${kind})` : dims;
}

/** The header's word on the kernel's controller. */
export function controllerText(status: StatusData | null | undefined): string {
  if (status?.closed) {
    return 'controller closed';
  }
  return status && !status.started ? 'controller not started yet' : 'connected';
}
