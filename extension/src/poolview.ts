/**
 * The sidebar's view of a shared device pool: its tenants (this notebook's controller among
 * them) with their colours, shares and queues, the other tenants' recent computations, and a
 * strip per device cell showing how busy each other tenant kept it. Hidden when the kernel's
 * controller is no tenant of a pool (`status.pool` is null).
 */

import { h } from './dom';
import { cellOthers } from './groups';
import { formatBytes, PoolInfo } from './protocol';

/** At most this many of the other tenants' recent computations are listed. */
export const MOST_RECENT = 8;

// Other tenants' work is drawn hatched, like their bars in the schedule view.
function hatched(color: string): string {
  return `repeating-linear-gradient(45deg, ${color} 0 3px, transparent 3px 5px)`;
}

function swatch(color: string): HTMLElement {
  const el = h('span', { class: 'pw-swatch' });
  if (color) {
    el.style.background = hatched(color);
  }
  return el;
}

function percent(f: number): string {
  return `${Math.round(f * 100)}%`;
}

function ms(seconds: number): string {
  return seconds < 1 ? `${(seconds * 1e3).toFixed(1)} ms` : `${seconds.toFixed(2)} s`;
}

/** Fill `el` with the pool's section (or hide it). */
export function renderPool(el: HTMLElement, pool: PoolInfo | null): void {
  el.hidden = !pool;
  if (!pool) {
    el.replaceChildren();
    return;
  }
  const tenants = pool.tenants.map(t =>
    h(
      'div',
      { class: 'pw-tenant', 'data-tenant': t.name, 'data-me': String(t.me) },
      swatch(t.color),
      h('strong', {}, t.me ? `${t.name} (this notebook)` : t.name),
      h(
        'span',
        { class: 'pw-tenant-meta' },
        ` share ${percent(t.share)} · ${t.running} running, ${t.queued} queued · ` +
          `${formatBytes(t.bytes)}` +
          (t.devices.length ? ` · devices ${t.devices.join(', ')}` : '')
      )
    )
  );
  const recent = pool.recent.slice(0, MOST_RECENT).map(r =>
    h(
      'div',
      { class: 'pw-other-work', 'data-tenant': r.tenant },
      swatch(pool.tenants.find(t => t.name === r.tenant)?.color ?? ''),
      h('code', {}, r.name),
      ` ${r.client} · island ${r.island}, devices ${r.devices.join(', ')} · ` +
        `${ms(r.duration)}, ${r.ago.toFixed(1)} s ago`
    )
  );
  el.replaceChildren(
    h('h3', {}, `Pool ${pool.name}`),
    h('div', { class: 'pw-tenants' }, ...tenants),
    ...(recent.length
      ? [h('div', { class: 'pw-recent-head' }, "Other tenants' recent work"), ...recent]
      : [])
  );
}

/** A cell's strip of the other tenants' busy fractions (empty outside a pool). */
export function othersStrip(
  devices: number[],
  facts: Map<number, { others?: Record<string, number> }>,
  pool: PoolInfo | null
): HTMLElement {
  const strip = h('div', { class: 'pw-others' });
  if (!pool) {
    return strip;
  }
  const colors = new Map(pool.tenants.map(t => [t.name, t.color]));
  for (const [tenant, f] of cellOthers(devices, facts)) {
    const part = h('span', {
      class: 'pw-other',
      'data-tenant': tenant,
      title: `${tenant}: ${percent(f)} busy over the last 2 s`
    });
    part.style.width = percent(f);
    part.style.background = hatched(colors.get(tenant) || '#999999');
    strip.append(part);
  }
  return strip;
}
