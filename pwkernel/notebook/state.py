"""What the notebook extension keeps per kernel (``NotebookState``), and the one that is
loaded: the magics, the displays and the sidebar's comm all read it from here."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..runtime.controller import Controller, controller, running_default
from ..runtime.errors import DeviceSetupError
from ..runtime.events import ClientSpec
from ..runtime.resources import VirtualSlice
from .output import CellOutput


class NotebookState:
    """What the extension keeps per kernel: the controller, named slices, the default client,
    slices made for ``--devices`` cells, and ``--no-block`` outputs still to be shown."""

    def __init__(self, ctl: Controller | None = None, user_ns: dict[str, Any] | None = None):
        self._ctl = ctl
        self.user_ns = user_ns if user_ns is not None else {}
        self.slices: dict[str, VirtualSlice] = {}
        self.client = ClientSpec()
        self.temporary: list[tuple[Any, VirtualSlice]] = []
        self.live: list[CellOutput] = []
        self._default: VirtualSlice | None = None
        self.views: Any = None  # the live views each cell showed (``reruns.ShownViews``)

    @property
    def ctl(self) -> Controller:
        """The hosted controller, started now if it was not yet."""
        return self.controller()

    def controller(self) -> Controller:
        if self._ctl is None or self._ctl.closed:  # not started, or closed behind our back
            if self._ctl is not None:
                self._default = None
                self.slices.clear()
            try:
                self._ctl = controller()
            except DeviceSetupError as e:  # (JAX set up before the first cell: one line)
                raise UsageError(f"%pathways: {e}") from None
        return self._ctl

    def peek(self) -> Controller | None:
        """The controller if one runs (ours, or the process-wide one the user started);
        never starts one, so JAX's backend is left alone until the user needs it."""
        if self._ctl is not None and not self._ctl.closed:
            return self._ctl
        if running_default() is not None:
            return self.controller()
        return None

    def shown(self) -> Controller | None:
        """What the sidebar shows: ``peek()``, else the hosted controller that was closed
        (so the sidebar says it is closed rather than not started); never starts one."""
        running = self.peek()
        return running if running is not None else self._ctl

    def adopt(self, ctl: Controller) -> None:
        """Host ``ctl`` from now on (``%pathways attach``); its default slice is made anew."""
        self._ctl, self._default = ctl, None

    def slice_names(self) -> dict[int, str]:
        """A name for each slice: its ``%pathways slice`` name, else a variable holding it."""
        names = {vs.id: n for n, vs in list(self.user_ns.items())
                 if isinstance(vs, VirtualSlice) and not n.startswith("_")}
        names.update({vs.id: n for n, vs in self.slices.items()})
        return names

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

    def release_all(self, user_ns: dict | None = None) -> list[str]:
        """Release every slice the magics made; returns their names. ``user_ns``: the
        notebook's names, unbound where they still hold their slice (not once rebound)."""
        names = list(self.slices)
        for name, vs in self.slices.items():
            vs.release()
            if user_ns is not None and user_ns.get(name) is vs:
                del user_ns[name]
        self.slices.clear()
        for _, vs in self.temporary:
            vs.release()
        self.temporary = []
        self.live = []
        return names


_current: NotebookState | None = None


def current() -> NotebookState | None:
    """The loaded extension's state, or None."""
    return _current


def install(st: NotebookState | None) -> NotebookState | None:
    """Make ``st`` the loaded state (None: unloaded); returns the one it replaces."""
    global _current
    previous, _current = _current, st
    return previous
