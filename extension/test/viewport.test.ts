/**
 * A BokehJS plot view removes the `resize` listener it added to the window's visual viewport
 * (BokehJS never does, so every plot the page drew stayed reachable from the window).
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { noteListeners, releaseViewportListeners } from '../src/viewport';

/** A visual viewport that counts its `resize` listeners. */
class Viewport extends EventTarget {
  listeners = new Set<unknown>();
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null): void {
    if (type === 'resize') {
      this.listeners.add(listener);
    }
    super.addEventListener(type, listener);
  }
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null): void {
    if (type === 'resize') {
      this.listeners.delete(listener);
    }
    super.removeEventListener(type, listener);
  }
}

/** BokehJS's PlotView as far as the listener goes: added in connect_signals, kept. */
class PlotView {
  removed = false;
  connect_signals(): void {
    (globalThis as { visualViewport?: EventTarget }).visualViewport?.addEventListener(
      'resize', () => this.removed);
  }
  remove(): void {
    this.removed = true;
  }
}

test('a removed plot view takes its viewport listener with it', () => {
  const viewport = new Viewport();
  (globalThis as { visualViewport?: EventTarget }).visualViewport = viewport;
  try {
    assert.equal(releaseViewportListeners(PlotView.prototype), true);
    assert.equal(releaseViewportListeners(PlotView.prototype), false); // once
    const views = Array.from({ length: 20 }, () => new PlotView());
    views.forEach(view => view.connect_signals());
    assert.equal(viewport.listeners.size, 20);
    views.slice(0, 19).forEach(view => view.remove());
    assert.equal(viewport.listeners.size, 1); // the one still shown
    assert.ok(views[0].removed && !views[19].removed); // BokehJS's own remove() still runs
    assert.equal(Object.prototype.hasOwnProperty.call(viewport, 'addEventListener'), false);
  } finally {
    delete (globalThis as { visualViewport?: EventTarget }).visualViewport;
  }
});

test('only resize listeners are noted, and the target adds as before', () => {
  const target = new Viewport();
  const noted = noteListeners(target, () => {
    target.addEventListener('scroll', () => 0);
    target.addEventListener('resize', () => 1);
  });
  assert.equal(noted.length, 1);
  assert.equal(target.listeners.size, 1);
  assert.equal(Object.prototype.hasOwnProperty.call(target, 'addEventListener'), false);
});
