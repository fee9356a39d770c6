"""``%load_ext pwkernel``: host the process-wide controller in this kernel.

Loading registers the magics (``%pathways``, ``%%pathways``), the rich displays and the
``pwkernel`` comm target, and prints one line. Loading twice is harmless;
``%unload_ext pwkernel`` cancels what is queued and closes the controller.

Loading does not start the controller, nor JAX's backend: the controller starts with the first
``%pathways`` command or ``%%pathways`` cell (or the user's own ``pw.controller()``). So a
notebook whose first cell configures JAX (``jax.config.update('jax_num_cpu_devices', 8)``,
``XLA_FLAGS``) runs unchanged on the Pathways kernel.

>>> ip = IPython.get_ipython()            # doctest: +SKIP
>>> ip.run_line_magic("load_ext", "pwkernel")   # doctest: +SKIP
pwkernel: loaded; the controller starts with the first %pathways ...
"""

from __future__ import annotations

from typing import Any

from ..runtime import controller as process
from ..runtime.controller import Controller, controller
from ..runtime.resources import VirtualSlice
from ..runtime.tasks import ClientSpec
from . import comm, display
from .display import _devices
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

    @property
    def ctl(self) -> Controller:
        """The hosted controller, started now if it was not yet."""
        return self.controller()

    @ctl.setter
    def ctl(self, value: Controller) -> None:
        self._ctl = value

    def controller(self) -> Controller:
        if self._ctl is None or self._ctl.closed:  # not started, or closed behind our back
            if self._ctl is not None:
                self._default = None
                self.slices.clear()
            self._ctl = controller()
        return self._ctl

    def peek(self) -> Controller | None:
        """The controller if one runs (ours, or the process-wide one the user started);
        never starts one, so JAX's backend is left alone until the user needs it."""
        if self._ctl is not None and not self._ctl.closed:
            return self._ctl
        running = process._default
        if running is not None and not running.closed:
            return self.controller()
        return None

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


def waiting_banner() -> str:
    return ("pwkernel: loaded; the controller starts with the first %pathways command or cell "
            "(or pw.controller()), on the islands PWKERNEL_ISLANDS names or JAX's devices. "
            "Until then JAX is untouched: configure it first if you need to.")


def load_ipython_extension(ip) -> None:
    """Register magics, displays and the comm target; the controller starts when needed."""
    global _state
    if _state is not None:
        ctl = _state.peek()
        print(banner(ctl) if ctl is not None else waiting_banner())
        return
    from .magics import PathwaysMagics

    _state = NotebookState(user_ns=ip.user_ns)
    ip.register_magics(PathwaysMagics(ip, _state))
    display.register(ip)
    comm.register(ip, _state.peek)
    ip.events.register("pre_run_cell", _pre_run_cell)
    ctl = _state.peek()  # a controller the user started before loading us
    print(banner(ctl) if ctl is not None else waiting_banner())


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
    ctl = st.peek()
    if ctl is not None:
        ctl.close()
    print("pwkernel: controller closed" if ctl is not None else "pwkernel: unloaded")
