/**
 * One comm with a kernel's `pwkernel` target: opens it (asking for status pushes), validates
 * every message, matches replies to requests by `id`, and tells whether the target exists.
 *
 * The comm lives on a kernel subshell (JEP 91) where the kernel has them: JupyterLab sends comm
 * messages to a subshell of their own, and we open the comm only once that subshell exists, so
 * the sidebar connects and its requests (Cancel above all) are answered while a cell runs.
 */

import type { Kernel, KernelMessage } from '@jupyterlab/services';

import { parseReply, ProtocolError, Reply, Request, TARGET } from './protocol';

/** Seconds between status pushes the sidebar asks for (the kernel sends only changes). */
export const PUSH_INTERVAL = 0.5;
/** How long an idle kernel may stay silent after comm open before we call it not loaded. */
const SILENT_MS = 10_000;
const REQUEST_MS = 60_000;
/** How long to wait for the comm's subshell, and for the kernel to handle our comm_close. */
const SUBSHELL_MS = 10_000;
const CLOSE_MS = 10_000;

/** Resolves when `p` settles or after `ms`, whichever comes first; never rejects. */
function settled(p: Promise<unknown>, ms: number): Promise<void> {
  return new Promise<void>(resolve => {
    const timer = setTimeout(resolve, ms);
    p.then(
      () => resolve(),
      () => resolve()
    ).finally(() => clearTimeout(timer));
  });
}

/**
 * Wait until the comm's subshell exists (JupyterLab starts it when the comm is created), so
 * that even `comm_open` goes to it and not behind a running cell. Nothing to wait for where
 * the kernel has no subshells or comms over subshells are turned off in the settings.
 */
async function subshellReady(kernel: Kernel.IKernelConnection, comm: Kernel.IComm) {
  await settled(kernel.info, SUBSHELL_MS);
  const started = (comm as { subshellStarted?: Promise<void> }).subshellStarted;
  if (kernel.supportsSubshells && comm.commsOverSubshells !== 'disabled' && started) {
    await settled(started, SUBSHELL_MS);
  }
}

export type OpenResult = 'connected' | 'not-loaded' | 'disposed';

interface Pending {
  resolve: (r: Reply) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

export class KernelLink {
  /**
   * @param onReply every valid message from the kernel (pushes and replies)
   * @param onInvalid a message that failed validation
   * @param onLost the comm closed after it had connected (kernel died, extension unloaded)
   */
  constructor(
    readonly kernel: Kernel.IKernelConnection,
    private onReply: (r: Reply) => void,
    private onInvalid: (e: ProtocolError) => void,
    private onLost: () => void
  ) {}

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Open the comm; resolves once the kernel answered, or it is known not to have the target. */
  async open(): Promise<OpenResult> {
    let comm: Kernel.IComm;
    try {
      comm = this.kernel.createComm(TARGET);
    } catch (e) {
      return 'not-loaded';
    }
    await subshellReady(this.kernel, comm);
    if (this._disposed || comm.isDisposed) {
      if (!comm.isDisposed) {
        comm.dispose();
      }
      return 'disposed';
    }
    return new Promise<OpenResult>(resolve => {
      this._settle = resolve;
      this._comm = comm;
      comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => this._onMsg(msg.content.data);
      comm.onClose = () => {
        this._comm = null;
        if (this._disposed) {
          return;
        }
        if (!this._connected) {
          // ipykernel closes a comm whose target is not registered: no controller here yet.
          this._finish('not-loaded');
        } else {
          this._failPending(new Error('the kernel closed the Pathways comm'));
          this.onLost();
        }
      };
      comm.open({ interval: PUSH_INTERVAL });
      this._silence = setTimeout(() => {
        // A kernel that neither answers nor closes the comm while idle has no such target.
        if (!this._connected && this.kernel.status === 'idle') {
          this._finish('not-loaded');
          this.dispose();
        }
      }, SILENT_MS);
    });
  }

  /** Send a request; resolves with its validated reply (an `error` reply included). */
  request(req: Request): Promise<Reply> {
    const comm = this._comm;
    if (!comm || this._disposed || comm.isDisposed) {
      return Promise.reject(new Error('not connected to the kernel: open a notebook on a kernel'));
    }
    const id = this._next++;
    return new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(new Error(`the kernel did not answer '${req.type}' within ${REQUEST_MS / 1000} s`));
      }, REQUEST_MS);
      this._pending.set(id, { resolve, reject, timer });
      comm.send({ ...req, id } as any);
    });
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._finish('disposed');
    this._failPending(new Error('the connection to the kernel was closed'));
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed) {
      void closeComm(this.kernel, comm); // the kernel stops pushing to this comm
    }
  }

  private _onMsg(data: unknown): void {
    if (this._disposed) {
      return;
    }
    let reply: Reply;
    try {
      reply = parseReply(data);
    } catch (e) {
      this.onInvalid(e instanceof ProtocolError ? e : new ProtocolError(String(e)));
      return;
    }
    if (!this._connected) {
      this._connected = true;
      this._finish('connected');
    }
    this.onReply(reply);
    if (typeof reply.id === 'number') {
      const p = this._pending.get(reply.id);
      if (p) {
        this._pending.delete(reply.id);
        clearTimeout(p.timer);
        p.resolve(reply);
      }
    }
  }

  private _finish(result: OpenResult): void {
    if (this._silence) {
      clearTimeout(this._silence);
      this._silence = null;
    }
    const settle = this._settle;
    this._settle = null;
    settle?.(result);
  }

  private _failPending(err: Error): void {
    for (const p of this._pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this._pending.clear();
  }

  private _comm: Kernel.IComm | null = null;
  private _connected = false;
  private _disposed = false;
  private _next = 1;
  private _pending = new Map<number, Pending>();
  private _settle: ((r: OpenResult) => void) | null = null;
  private _silence: ReturnType<typeof setTimeout> | null = null;
}

/**
 * Close a comm so that the kernel sees it closed. Closing the last comm of a target makes
 * JupyterLab delete the target's subshell at once, and a kernel drops a `comm_close` that
 * reaches a deleted subshell (the kernel would push to the comm forever). So a second comm,
 * never opened, holds the subshell until the kernel has handled the close.
 */
async function closeComm(kernel: Kernel.IKernelConnection, comm: Kernel.IComm): Promise<void> {
  let keeper: Kernel.IComm | null = null;
  try {
    keeper = kernel.createComm(TARGET);
    await subshellReady(kernel, keeper);
  } catch {
    // no comms on this connection any more: close without it
  }
  try {
    await settled(comm.close().done, CLOSE_MS);
  } catch {
    // the kernel is already gone
  } finally {
    if (keeper && !keeper.isDisposed) {
      keeper.dispose();
    }
  }
}
