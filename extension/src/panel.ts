/**
 * The Pathways sidebar: the active notebook's controller (islands, devices, slices, programs,
 * policy) and its actions. It follows the active notebook and reconnects after restarts.
 */

import { Notification } from '@jupyterlab/apputils';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { KernelLink } from './connection';
import { h } from './dom';
import { deviceCells } from './groups';
import { othersStrip, renderPool } from './poolview';
import {
  applyReply,
  cancelRequest,
  controllerText,
  DISPATCH_MODES,
  formatBytes,
  initialState,
  POLICIES,
  policyRequest,
  Reply,
  Request,
  ROW_MODES,
  RowMode,
  sliceMesh,
  State,
  traceRequest,
  withConnection
} from './protocol';

export const SIDEBAR_ID = 'pwkernel-sidebar';
export const SCHEDULE_CODE = 'import pwkernel as pw; pw.ScheduleView(pw.controller())';
export const PATHWAYS_CELL = '%%pathways\n';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161">' +
  '<rect x="2" y="3" width="8" height="8" rx="1"/><rect x="14" y="3" width="8" height="8" rx="1"/>' +
  '<rect x="2" y="13" width="8" height="8" rx="1"/><rect x="14" y="13" width="8" height="8" rx="1"/>' +
  '</g></svg>';

export const pathwaysIcon = new LabIcon({ name: 'pwkernel:pathways', svgstr: ICON_SVG });

/** The trace rows' choices as the sidebar names them (the value sent is the mode itself). */
const ROW_TEXT: Record<RowMode, string> = {
  auto: 'auto (per device up to 64)',
  device: 'a track per device',
  host: 'a track per host',
  island: 'a track per island'
};

const STATE_TEXT: Record<State['connection'], string> = {
  'no-notebook': 'Open a notebook to see its Pathways controller.',
  'no-kernel': 'The notebook has no kernel yet.',
  connecting: 'Connecting to the kernel…',
  connected: 'connected',
  'not-loaded': 'This kernel has no Pathways controller yet.',
  loading: 'Loading pwkernel in the kernel…',
  restarting: 'The kernel is restarting…'
};

export class PathwaysPanel extends Widget {
  constructor() {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('pw-Sidebar');
    this.title.icon = pathwaysIcon;
    this.title.caption = 'Pathways';
    this._build();
    this._render();
  }

  get state(): State {
    return this._state;
  }

  get notebook(): NotebookPanel | null {
    return this._notebook;
  }

  /** Show the controller of `panel`'s kernel (null: no notebook is active). */
  follow(panel: NotebookPanel | null): void {
    if (panel === this._notebook) {
      return;
    }
    if (this._notebook) {
      const ctx = this._notebook.sessionContext;
      ctx.statusChanged.disconnect(this._onStatus, this);
      ctx.kernelChanged.disconnect(this._onKernel, this);
      ctx.iopubMessage.disconnect(this._onIOPub, this);
    }
    this._notebook = panel;
    this._drop();
    if (!panel) {
      this._set(withConnection(this._state, 'no-notebook'));
      return;
    }
    panel.sessionContext.statusChanged.connect(this._onStatus, this);
    panel.sessionContext.kernelChanged.connect(this._onKernel, this);
    panel.sessionContext.iopubMessage.connect(this._onIOPub, this);
    this._set(withConnection(this._state, 'no-kernel'));
    void panel.sessionContext.ready.then(() => {
      if (this._notebook === panel) {
        void this.connect();
      }
    });
  }

  /** (Re)open the comm with the current notebook's kernel. `quiet`: a probe of a kernel
   * without pwkernel, which keeps showing that state while it asks. */
  async connect(quiet = false): Promise<void> {
    this._drop();
    const kernel = this._notebook?.sessionContext.session?.kernel ?? null;
    if (!kernel) {
      this._set(withConnection(this._state, this._notebook ? 'no-kernel' : 'no-notebook'));
      return;
    }
    const name = this._notebook?.sessionContext.kernelDisplayName ?? kernel.name;
    if (!quiet) {
      this._set(withConnection(this._state, 'connecting', name));
    }
    const link = new KernelLink(
      kernel,
      reply => this._onReply(reply),
      err => this._set({ ...this._state, message: err.message, error: true }),
      () => {
        if (this._link === link) {
          this._link = null;
          this._set(withConnection(this._state, this._kernelLost(kernel) ? 'restarting' : 'not-loaded'));
        }
      }
    );
    this._link = link;
    const result = await link.open();
    if (this._link === link && result === 'not-loaded') {
      this._link = null;
      this._set(withConnection(this._state, 'not-loaded', name));
    }
  }

  /** Run `%load_ext pwkernel` in the kernel and start its controller (loading alone leaves
   * JAX alone), then connect. */
  async loadExtension(): Promise<void> {
    const kernel = this._notebook?.sessionContext.session?.kernel;
    if (!kernel) {
      return;
    }
    this._set(withConnection(this._state, 'loading'));
    const future = kernel.requestExecute({
      code: '%load_ext pwkernel\n%pathways status',
      silent: false,
      store_history: false
    });
    let failure = '';
    future.onIOPub = msg => {
      if (msg.header.msg_type === 'error') {
        const c = msg.content as { ename: string; evalue: string };
        failure = `${c.ename}: ${c.evalue}`;
      }
    };
    const reply = await future.done;
    if (reply.content.status !== 'ok' || failure) {
      this._set({
        ...withConnection(this._state, 'not-loaded'),
        message: `%load_ext pwkernel failed: ${failure || reply.content.status}. Is pwkernel ` +
          "installed in this kernel's environment (pip install -e . in the repository)?",
        error: true
      });
      return;
    }
    await this.connect();
  }

  /** Send one request; its reply (or the failure) shows in the panel. */
  async request(req: Request): Promise<Reply | null> {
    if (!this._link) {
      this._set({
        ...this._state,
        message: 'Not connected: open a notebook whose kernel has pwkernel loaded.',
        error: true
      });
      return null;
    }
    try {
      return await this._link.request(req);
    } catch (e) {
      this._set({ ...this._state, message: (e as Error).message, error: true });
      return null;
    }
  }

  /** Ask the kernel to save the trace with tracks `rows` (default: the sidebar's Rows
   * choice); returns the path, or null. */
  async exportTrace(rows: string = this._rows.value): Promise<string | null> {
    let req: Request;
    try {
      req = traceRequest(rows);
    } catch (e) {
      this._set({ ...this._state, message: (e as Error).message, error: true });
      return null;
    }
    const reply = await this.request(req);
    if (reply?.type === 'trace') {
      Notification.success(`Pathways trace saved: ${reply.path}`, { autoClose: 5000 });
      return reply.path;
    }
    return null;
  }

  /** Insert a cell below the active one showing the live schedule, and run it. */
  async showSchedule(): Promise<void> {
    const nb = this._notebook;
    if (!nb) {
      return;
    }
    NotebookActions.insertBelow(nb.content);
    nb.content.activeCell?.model.sharedModel.setSource(SCHEDULE_CODE);
    await NotebookActions.run(nb.content, nb.sessionContext);
  }

  dispose(): void {
    this.follow(null);
    super.dispose();
  }

  // --- connection life ---------------------------------------------------------------------
  private _drop(): void {
    const link = this._link;
    this._link = null;
    link?.dispose();
  }

  private _kernelLost(kernel: Kernel.IKernelConnection): boolean {
    return kernel.isDisposed || ['restarting', 'autorestarting', 'dead'].includes(kernel.status);
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (['restarting', 'autorestarting', 'dead', 'terminating'].includes(status)) {
      this._drop();
      this._set(withConnection(this._state, 'restarting'));
    } else if (status === 'idle' && this._state.connection === 'restarting') {
      void this.connect();
    } else if (status === 'idle' && this._state.connection === 'not-loaded' && this._ranCode) {
      // Code ran in a kernel without pwkernel (`%load_ext pwkernel` typed in a cell, maybe
      // after `%unload_ext`): ask again. Only after code ran: a probe makes the kernel busy
      // and idle too, and must not start another.
      this._ranCode = false;
      void this.connect(true);
    }
  }

  private _onIOPub(_: unknown, msg: KernelMessage.IMessage): void {
    if (msg.header.msg_type === 'execute_input' && this._state.connection === 'not-loaded') {
      this._ranCode = true;
    }
  }

  private _onKernel(): void {
    void this.connect();
  }

  private _onReply(reply: Reply): void {
    this._set(applyReply(this._state, reply));
  }

  private _set(state: State): void {
    this._state = state;
    this._render();
  }

  // --- the DOM -------------------------------------------------------------------------------
  private _build(): void {
    const n = this.node;
    this._connEl = h('div', { class: 'pw-connection' });
    this._loadButton = h('button', { class: 'jp-mod-styled jp-mod-accept pw-load' }, 'Load pwkernel');
    this._loadButton.addEventListener('click', () => void this.loadExtension());
    this._policy = h('select', { class: 'pw-policy', 'aria-label': 'policy' }) as HTMLSelectElement;
    POLICIES.forEach(p => this._policy.append(h('option', { value: p }, p)));
    this._policy.addEventListener('change', () =>
      void this.request(policyRequest(this._policy.value))
    );
    this._dispatch = h('select', { class: 'pw-dispatch', 'aria-label': 'dispatch' }) as HTMLSelectElement;
    DISPATCH_MODES.forEach(d => this._dispatch.append(h('option', { value: d }, d)));
    this._dispatch.addEventListener('change', () =>
      void this.request({ type: 'dispatch', dispatch: this._dispatch.value as any })
    );
    const schedule = h('button', { class: 'jp-mod-styled pw-schedule' }, 'Show schedule');
    schedule.addEventListener('click', () => void this.showSchedule());
    const exportBtn = h('button', { class: 'jp-mod-styled pw-export' }, 'Export trace');
    exportBtn.addEventListener('click', () => void this.exportTrace());
    this._rows = h('select', {
      class: 'pw-rows',
      'aria-label': 'trace rows',
      title: "the exported trace's tracks: as %pathways trace save --rows picks them"
    }) as HTMLSelectElement;
    ROW_MODES.forEach(r => this._rows.append(h('option', { value: r }, ROW_TEXT[r])));
    this._message = h('div', { class: 'pw-message', role: 'status' });
    this._islands = h('div', { class: 'pw-islands' });
    this._pool = h('div', { class: 'pw-pool' });
    this._slices = h('div', { class: 'pw-slices' });
    this._runs = h('div', { class: 'pw-runs' });
    this._runs.addEventListener('click', ev => {
      const btn = (ev.target as HTMLElement).closest('button.pw-cancel');
      const id = btn?.getAttribute('data-run');
      if (id !== null && id !== undefined) {
        void this.request(cancelRequest(Number(id)));
      }
    });
    this._body = h(
      'div',
      { class: 'pw-body' },
      h(
        'div',
        { class: 'pw-controls' },
        h('label', {}, 'Policy ', this._policy),
        h('label', {}, 'Dispatch ', this._dispatch)
      ),
      h(
        'div',
        { class: 'pw-actions' },
        schedule,
        exportBtn,
        h('label', { class: 'pw-export-rows' }, 'rows ', this._rows)
      ),
      this._pool,
      h('h3', {}, 'Islands'),
      this._islands,
      h('h3', {}, 'Slices'),
      this._slices,
      h('h3', {}, 'Programs'),
      this._runs
    );
    n.append(
      h('header', { class: 'pw-header' }, h('h2', {}, 'Pathways'), this._connEl),
      this._loadButton,
      this._message,
      this._body
    );
  }

  private _render(): void {
    if (!this._body) {
      return;
    }
    const s = this._state;
    this.node.dataset.connection = s.connection;
    this._connEl.textContent =
      s.connection === 'connected'
        ? `${s.kernelName || 'kernel'} · ${controllerText(s.status)}`
        : STATE_TEXT[s.connection];
    this._loadButton.hidden = s.connection !== 'not-loaded';
    this._message.textContent = s.message;
    this._message.classList.toggle('pw-error', s.error);
    this._message.hidden = !s.message;
    const status = s.connection === 'connected' ? s.status : null;
    this._body.hidden = !status;
    if (!status) {
      return;
    }
    if (document.activeElement !== this._policy) {
      this._policy.value = status.policy;
    }
    if (document.activeElement !== this._dispatch) {
      this._dispatch.value = status.dispatch;
    }
    renderPool(this._pool, status.pool);
    this._renderIslands(status);
    this._renderSlices(status);
    this._renderRuns(status);
  }

  private _renderIslands(status: NonNullable<State['status']>): void {
    const byId = new Map(status.devices.map(d => [d.id, d]));
    this._islands.replaceChildren(
      ...status.islands.map(isl => {
        const grid = h('div', { class: 'pw-grid' });
        // a cell per device, or per run of devices on a large (simulated) island
        for (const cell of deviceCells(isl.devices, byId)) {
          const pct = Math.round(cell.utilization * 100);
          const bar = h('div', { class: 'pw-bar' });
          bar.style.height = `${pct}%`;
          const what = cell.devices.length === 1 ? 'device' : 'devices';
          grid.append(
            h(
              'div',
              {
                class: 'pw-device',
                'data-device': cell.label,
                'data-busy': String(cell.busy),
                title: `${what} ${cell.label}: ${pct}% busy over the last 2 s, ` +
                  `${formatBytes(cell.memory)} held`
              },
              bar,
              othersStrip(cell.devices, byId, status.pool),
              h('span', { class: 'pw-dev-id' }, cell.label),
              h('span', { class: 'pw-dev-util' }, `${pct}%`),
              h('span', { class: 'pw-dev-mem' }, formatBytes(cell.memory))
            )
          );
        }
        return h(
          'div',
          { class: 'pw-island', 'data-island': String(isl.id) },
          h(
            'div',
            { class: 'pw-island-head' },
            h('strong', {}, `Island ${isl.id}`),
            ` ${isl.platform} · ${isl.devices.length} devices`
          ),
          h(
            'div',
            { class: 'pw-island-load' },
            `programs: ${isl.programs_running} running, ${isl.programs_queued} queued · ` +
              `computations: ${isl.running} running, ${isl.queued} queued`
          ),
          grid
        );
      })
    );
  }

  private _renderSlices(status: NonNullable<State['status']>): void {
    const rows = status.named_slices.map(sl =>
      h(
        'div',
        { class: 'pw-slice', 'data-slice': sl.name },
        h('code', {}, sl.name),
        ` ${sliceMesh(sl)} on island ${sl.island}, devices ${sl.devices.join(', ')}`
      )
    );
    this._slices.replaceChildren(
      ...(rows.length ? rows : [h('div', { class: 'pw-empty' }, 'none (%pathways slice NAME N)')])
    );
  }

  /** Keyed by run id, so a Cancel button under the pointer survives the next push. */
  private _renderRuns(status: NonNullable<State['status']>): void {
    const seen = new Set<number>();
    for (const r of status.runs) {
      seen.add(r.id);
      let row = this._runRows.get(r.id);
      if (!row) {
        row = h(
          'div',
          { class: 'pw-run', 'data-run': String(r.id) },
          h('span', { class: 'pw-run-name' }),
          h('span', { class: 'pw-run-meta' }),
          h('button', { class: 'jp-mod-styled jp-mod-warn pw-cancel', 'data-run': String(r.id) },
            'Cancel')
        );
        this._runRows.set(r.id, row);
      }
      row.dataset.state = r.state;
      const where = r.state === 'running' ? r.running_on : r.islands;
      row.children[0].textContent = `#${r.id} ${r.name}`;
      row.children[1].textContent =
        `${r.client} · ${r.state}` + (where.length ? ` on island ${where.join(', ')}` : '');
      this._runs.append(row); // keeps the kernel's order; moves, never re-creates
    }
    for (const [id, row] of this._runRows) {
      if (!seen.has(id)) {
        row.remove();
        this._runRows.delete(id);
      }
    }
    this._runsEmpty ??= h('div', { class: 'pw-empty' }, 'no programs running');
    if (status.runs.length) {
      this._runsEmpty.remove();
    } else {
      this._runs.append(this._runsEmpty);
    }
  }

  private _state: State = initialState();
  private _notebook: NotebookPanel | null = null;
  private _link: KernelLink | null = null;
  private _ranCode = false; // code ran since the last probe of a kernel without pwkernel
  private _runRows = new Map<number, HTMLElement>();
  private _runsEmpty: HTMLElement | null = null;
  private _body!: HTMLElement;
  private _connEl!: HTMLElement;
  private _loadButton!: HTMLElement;
  private _policy!: HTMLSelectElement;
  private _dispatch!: HTMLSelectElement;
  private _rows!: HTMLSelectElement;
  private _message!: HTMLElement;
  private _islands!: HTMLElement;
  private _pool!: HTMLElement;
  private _slices!: HTMLElement;
  private _runs!: HTMLElement;
}
