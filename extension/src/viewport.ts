/**
 * Lets a removed Bokeh plot view go: BokehJS (3.x) adds a `resize` listener to
 * `window.visualViewport` for every plot view it draws (PlotView.connect_signals) and never
 * removes it, so every plot the page ever drew stayed reachable from the window, with its
 * canvases, DOM and renderers: about 0.7 MB and 500 DOM nodes per rerun of a
 * `view = pw.ScheduleView(ctl); view` cell, even once its document was released. Once BokehJS
 * is in the page, its PlotView notes the listeners it adds there and removes them when it is
 * removed (`views_manager.clear()` of a released document, a redraw).
 */

/** Marks a patched prototype. */
const PATCHED: unique symbol = Symbol('pwkernel.viewport-patched');
/** Holds a view's viewport listeners. */
const HELD: unique symbol = Symbol('pwkernel.viewport-listeners');

/** What this file uses of a BokehJS view class's prototype. */
export interface ViewPrototype {
  connect_signals(): void;
  remove(): void;
  [PATCHED]?: boolean;
}

type Listener = EventListenerOrEventListenerObject;

/** The window's visual viewport, or null where the browser has none. */
function viewport(): EventTarget | null {
  return (globalThis as { visualViewport?: EventTarget | null }).visualViewport ?? null;
}

/** Run `connect` while noting the `resize` listeners it adds to `target`; those listeners. */
export function noteListeners(target: EventTarget, connect: () => void): Listener[] {
  const added: Listener[] = [];
  const own = Object.prototype.hasOwnProperty.call(target, 'addEventListener');
  const add = target.addEventListener;
  target.addEventListener = function (
    type: string,
    listener: Listener | null,
    options?: boolean | AddEventListenerOptions
  ) {
    if (type === 'resize' && listener != null) {
      added.push(listener);
    }
    return add.call(this, type, listener, options);
  };
  try {
    connect();
  } finally {
    if (own) {
      target.addEventListener = add;
    } else {
      delete (target as { addEventListener?: unknown }).addEventListener; // the prototype's
    }
  }
  return added;
}

/** Make views of `proto` remove the viewport listeners they add; false if done before. */
export function releaseViewportListeners(proto: ViewPrototype): boolean {
  if (proto[PATCHED]) {
    return false;
  }
  proto[PATCHED] = true;
  const { connect_signals: connect, remove } = proto;
  proto.connect_signals = function (this: { [HELD]?: Listener[] }) {
    const target = viewport();
    if (target === null) {
      return connect.call(this);
    }
    const added = noteListeners(target, () => connect.call(this));
    this[HELD] = [...(this[HELD] ?? []), ...added];
  };
  proto.remove = function (this: { [HELD]?: Listener[] }) {
    const target = viewport();
    for (const listener of this[HELD] ?? []) {
      target?.removeEventListener('resize', listener);
    }
    delete this[HELD];
    return remove.call(this);
  };
  return true;
}

/** Patch BokehJS's PlotView once BokehJS is in the page; whether it is (now or before). */
export function patchBokeh(): boolean {
  const bokeh = (window as { Bokeh?: { require?(name: string): unknown } }).Bokeh;
  if (typeof bokeh?.require !== 'function') {
    return false;
  }
  let module: { PlotView?: { prototype: ViewPrototype } } | undefined;
  try {
    module = bokeh.require('models/plots/plot_canvas') as typeof module;
  } catch {
    return true; // another BokehJS: nothing known to patch
  }
  const proto = module?.PlotView?.prototype;
  if (proto !== undefined && typeof proto.connect_signals === 'function' &&
      typeof proto.remove === 'function') {
    releaseViewportListeners(proto);
  }
  return true;
}
