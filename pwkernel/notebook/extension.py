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

from ..runtime import interrupts
from ..runtime.controller import Controller
from ..runtime.units import device_ids
from . import comm, display, kernel_shutdown, reruns
from .state import NotebookState, current, install


def state() -> NotebookState | None:
    """The loaded extension's state, or None."""
    return current()


def _pre_run_cell(*_: Any) -> None:
    interrupts.install()  # (ipykernel puts Python's own SIGINT handler back for each cell)
    st = current()
    if st is not None:
        st.resend()
        st.sweep()


_kept_at_end: list[bool] = []  # an interrupt a hold kept as the cell's code ended


def _post_execute(*_: Any) -> None:
    _kept_at_end[:] = [interrupts.cell_ended()]


def _hidden_unders_follow(ip) -> None:
    """``_``, ``__`` and ``___`` among IPython's hidden names hold what the output history
    holds. IPython's flush (``%reset -f out``) resets them in the namespace only: the hidden
    copy kept the last results alive (a future and its device buffers, after ``del``), and
    the display hook, which took the namespace's ``''`` for a name the user bound, stopped
    updating ``_``. A name the user bound (not the display hook's value) is left alone."""
    hook, hidden, ns = ip.displayhook, ip.user_ns_hidden, ip.user_ns
    for name in ("_", "__", "___"):
        value = ns.get(name, hidden)
        if name in hidden and value is getattr(hook, name, hidden) and hidden[name] is not value:
            hidden[name] = value


def _post_run_cell(result: Any) -> None:
    """The cell fails with the interrupt a hold kept as its code ended (its last runtime call
    returned first): raised later, it landed in ipykernel's reply to the cell, or was lost.
    Then IPython's hidden ``_`` names follow its output history (``_hidden_unders_follow``)."""
    import IPython

    ip = IPython.get_ipython()
    if ip is not None:
        _hidden_unders_follow(ip)
    if _kept_at_end and _kept_at_end.pop() and result is not None and result.success:
        e = KeyboardInterrupt("the interrupt came in the cell's last runtime call, which ended "
                              "first: its results are bound; the kernel is ready")
        result.error_in_exec = e
        ip.showtraceback((KeyboardInterrupt, e, None))


def banner(ctl: Controller) -> str:
    islands = ", ".join(f"island {i.id}: {len(i.devices)} {i.platform} devices "
                        f"{device_ids(i.device_ids)}" for i in ctl.islands)
    return (f"pwkernel: {len(ctl.islands)} islands ({islands}); policy {ctl.policy}, dispatch "
            f"{ctl.dispatch}. Try %pathways status.")


def waiting_banner() -> str:
    return ("pwkernel: loaded; the controller starts with the first %pathways command or cell "
            "(or pw.controller()), on the islands PWKERNEL_ISLANDS names or JAX's devices. "
            "Until then JAX is untouched: configure it first if you need to.")


def load_ipython_extension(ip) -> None:
    """Register magics, displays and the comm target; the controller starts when needed."""
    if current() is not None:
        ctl = current().peek()
        print(banner(ctl) if ctl is not None else waiting_banner())
        return
    from .magics import PathwaysMagics

    st = NotebookState(user_ns=ip.user_ns)
    install(st)
    ip.register_magics(PathwaysMagics(ip, st))
    display.register(ip)
    comm.register(ip, st.shown)
    st.views = reruns.register(ip)  # a rerun cell closes the live views it no longer shows
    ip.events.register("pre_run_cell", _pre_run_cell)
    ip.events.register("post_execute", _post_execute)
    ip.events.register("post_run_cell", _post_run_cell)
    kernel_shutdown.register(ip)  # (closes the controllers before ipykernel ends its children)
    ctl = st.peek()  # a controller the user started before loading us
    print(banner(ctl) if ctl is not None else waiting_banner())


def unload_ipython_extension(ip) -> None:
    """Cancel what is queued, release the slices and close the controller."""
    st = install(None)
    if st is None:
        return
    for event, callback in (("pre_run_cell", _pre_run_cell), ("post_execute", _post_execute),
                            ("post_run_cell", _post_run_cell)):
        try:
            ip.events.unregister(event, callback)
        except ValueError:
            pass
    magics = ip.magics_manager.magics
    magics["line"].pop("pathways", None)
    magics["cell"].pop("pathways", None)
    display.unregister(ip)
    reruns.unregister(ip, st.views)
    comm.unregister(ip)
    kernel_shutdown.unregister(ip)
    st.release_all(ip.user_ns)
    ctl = st.peek()
    if ctl is not None:
        ctl.close()
    print("pwkernel: controller closed" if ctl is not None else "pwkernel: unloaded")
