/**
 * The one DOM helper the sidebar's views share.
 */

export type Attrs = Record<string, string>;

/** An element with attributes and children. */
export function h(tag: string, attrs: Attrs = {}, ...children: (Node | string)[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, v);
  }
  el.append(...children);
  return el;
}
