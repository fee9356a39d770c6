"""``%load_ext pwkernel``: host the process-wide controller in this kernel.

Loading registers the magics (``%pathways``, ``%%pathways``), the rich displays and the
``pwkernel`` comm target, and prints one line naming the islands. Loading twice is harmless;
``%unload_ext pwkernel`` cancels what is queued and closes the controller.

>>> ip = IPython.get_ipython()            # doctest: +SKIP
>>> ip.run_line_magic("load_ext", "pwkernel")   # doctest: +SKIP
pwkernel: 2 islands (island 0: 4 cpu devices [0-3], island 1: 4 cpu devices [4-7]); ...
"""

from __future__ import annotations

from typing import Any

from ..runtime.controller import Controller, controller
from ..runtime.dispatch import ClientSpec
from ..runtime.resources import VirtualSlice
from . import comm, display
from .display import _devices
from .output import CellOutput


class NotebookState:
    """What the extension keeps per kernel: the controller, named slices, the default client,
    slices made for ``--devices`` cells, and ``--no-block`` outputs still to be shown."""

    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.slices: dict[str, VirtualSlice] = {}
        self.client = ClientSpec()
        self.temporary: list[tuple[Any, VirtualSlice]] = []
        self.live: list[CellOutput] = []
        self._default: VirtualSlice | None = None

    def controller(self) -> Controller:
        if self.ctl.closed:  # closed behind our back (ctl.close()): host a fresh one
            self.ctl = controller()
            self._default = None
            self.slices.clear()
        return self.ctl

    def current(self) -> Controller:
        """The controller as it is, never replaced: for the comm, whose handlers run off the
        main thread while a cell may run on it."""
        return self.ctl

    def default_slice(self) -> VirtualSlice:
        """Where a cell without --slice/--devices runs: all of island 0."""
        if self._default is None or self._default.released:
            isl = self.controller().islands[0]
            self._default = self.ctl.slice(len(isl.devices), island=isl.id)
        return self._default

    def keep(self, vs: VirtualSlice) -> bool:
        """True while a program still runs on the temporary slice ``vs``."""
        return any(s is vs and not run.done() for run, s in self.temporary)

    def sweep(self) -> None:
        """Release temporary slices whose programs have ended."""
        still = []
        for run, vs in self.temporary:
            if run.done():
                vs.release()
            else:
                still.append((run, vs))
        self.temporary = still

    def watch(self, out: CellOutput) -> None:
        self.live.append(out)

    def resend(self) -> None:
        """A cell starts: show ``--no-block`` outputs again, with this cell as the parent."""
        self.live = [out for out in self.live if out.resend()]

    def release_all(self) -> list[str]:
        names = list(self.slices)
        for vs in self.slices.values():
            vs.release()
        self.slices.clear()
        for _, vs in self.temporary:
            vs.release()
        self.temporary = []
        self.live = []
        return names


_state: NotebookState | None = None


def state() -> NotebookState | None:
    """The loaded extension's state, or None."""
    return _state


def _pre_run_cell(*_: Any) -> None:
    if _state is not None:
        _state.resend()
        _state.sweep()


def banner(ctl: Controller) -> str:
    islands = ", ".join(f"island {i.id}: {len(i.devices)} {i.platform} devices "
                        f"{_devices(i.device_ids)}" for i in ctl.islands)
    return (f"pwkernel: {len(ctl.islands)} islands ({islands}); policy {ctl.policy}, dispatch "
            f"{ctl.dispatch}. Try %pathways status.")


def load_ipython_extension(ip) -> None:
    """Host the controller and register magics, displays and the comm target."""
    global _state
    if _state is not None and not _state.ctl.closed:
        print(banner(_state.ctl))
        return
    from .magics import PathwaysMagics

    _state = NotebookState(controller())
    ip.register_magics(PathwaysMagics(ip, _state))
    display.register(ip)
    comm.register(ip, _state.current)
    ip.events.register("pre_run_cell", _pre_run_cell)
    print(banner(_state.ctl))


def unload_ipython_extension(ip) -> None:
    """Cancel what is queued, release the slices and close the controller."""
    global _state
    if _state is None:
        return
    st, _state = _state, None
    try:
        ip.events.unregister("pre_run_cell", _pre_run_cell)
    except ValueError:
        pass
    magics = ip.magics_manager.magics
    magics["line"].pop("pathways", None)
    magics["cell"].pop("pathways", None)
    display.unregister(ip)
    comm.unregister(ip)
    for name, vs in st.slices.items():
        if ip.user_ns.get(name) is vs:
            del ip.user_ns[name]
    st.release_all()
    st.ctl.close()
    print("pwkernel: controller closed")
