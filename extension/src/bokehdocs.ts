/**
 * Releases the page's Bokeh documents of the live views the kernel closed.
 *
 * BokehJS lists every document it makes in `Bokeh.documents` and never removes one, and
 * jupyter_bokeh's widget view makes a document each time it draws (each output of a view)
 * without releasing it when the view goes: its plot's root views stay in `Bokeh.index`, and the
 * widget view itself stays referenced by the kernel's status signal. A page whose
 * `view = pw.ScheduleView(ctl); view` cell ran twenty times held twenty copies of the view's
 * rows. The kernel closes the widget of a live view that no output shows (a rerun cell's), and
 * just before it does it sends the page a `pw-release` message naming the plot's root model;
 * when the widget's comm then closes, every document holding that root is cleared (its
 * views removed, its data sources emptied, its roots dropped) and taken off `Bokeh.documents`. Clearing only after the
 * comm closed matters: the widget view reports the removed roots, and a widget still open
 * would pass that on to the kernel's document.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { KernelMessage } from '@jupyterlab/services';

import { patchBokeh } from './viewport';

/** The custom widget message the kernel sends before it closes a plot's widget. */
export const RELEASE = 'pw-release';

/** What this file uses of a BokehJS document. */
export interface BokehDocument {
  get_model_by_id(id: string): unknown;
  clear(): void;
  /** The views drawn of it (its roots' and its notifications'), set when it was drawn. */
  views_manager?: { clear(): void } | null;
  readonly all_models: Set<object>;
}

/** A BokehJS data source (a ColumnDataSource): `clear()` empties its columns. */
function isDataSource(model: object): model is { clear(): void } {
  const m = model as { clear?: unknown; get_length?: unknown };
  return typeof m.clear === 'function' && typeof m.get_length === 'function';
}

/** The root model ids of the plots whose widgets are closing, by comm id. */
const closing = new Map<string, string>();

/** Whether BokehJS's plot views were made to let go of their viewport listeners. */
let patched = false;

function bokehDocuments(): BokehDocument[] | null {
  const bokeh = (window as { Bokeh?: { documents?: BokehDocument[] } }).Bokeh;
  return bokeh?.documents ?? null;
}

/**
 * Clear and unlist every document of `documents` that holds the model `root`; how many.
 * The array is changed in place (it is BokehJS's own list).
 */
export function releaseDocuments(documents: BokehDocument[], root: string): number {
  const held = documents.filter(doc => doc.get_model_by_id(root) != null);
  for (const doc of held) {
    documents.splice(documents.indexOf(doc), 1);
    doc.views_manager?.clear(); // each view removed, from `Bokeh.index` too
    // The widget view keeps its document (the kernel's status signal keeps the widget view):
    // its rows go now.
    for (const model of doc.all_models) {
      if (isDataSource(model)) {
        model.clear();
      }
    }
    doc.clear();
  }
  return held.length;
}

/** One iopub message of a notebook's kernel: note a release, or do it once the comm closed. */
export function onIopub(msg: KernelMessage.IMessage): void {
  // BokehJS comes with a kernel's output, before the first plot is drawn (viewport.ts)
  patched ||= patchBokeh();
  const type = msg.channel === 'iopub' ? msg.header.msg_type : null;
  if (type === 'comm_msg') {
    const { comm_id, data } = (msg as KernelMessage.ICommMsgMsg<'iopub'>).content;
    const custom = (data as { method?: string; content?: { msg?: string; root?: unknown } })
      ?.content;
    if ((data as { method?: string }).method === 'custom' && custom?.msg === RELEASE &&
        typeof custom.root === 'string') {
      closing.set(comm_id, custom.root);
    }
  } else if (type === 'comm_close') {
    const { comm_id } = (msg as KernelMessage.ICommCloseMsg<'iopub'>).content;
    const root = closing.get(comm_id);
    const documents = bokehDocuments();
    closing.delete(comm_id);
    if (root !== undefined && documents !== null) {
      // After the widget manager's own handling of the close (its model lets go of the comm,
      // so what the widget view reports of the clearing goes nowhere).
      setTimeout(() => releaseDocuments(documents, root), 0);
    }
  }
}

export const releasePlugin: JupyterFrontEndPlugin<void> = {
  id: 'pwkernel:release-plots',
  description: "Releases the page's Bokeh documents of the live views the kernel closed.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker) => {
    const watch = (panel: NotebookPanel) =>
      panel.sessionContext.iopubMessage.connect((_, msg) => onIopub(msg));
    tracker.forEach(watch);
    tracker.widgetAdded.connect((_, panel) => watch(panel));
  }
};
