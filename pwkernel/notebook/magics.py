"""``%pathways`` and ``%%pathways``: thin magics over the controller.

The magics parse their arguments with the shared specs in ``args.py`` and hand explicit values
to one method per subcommand; running a cell lives in ``cell.py``, noticing its program's end
in ``endings.py``. Bad input raises ``UsageError`` (a short message, no traceback) that names
the fix.
"""

from __future__ import annotations

import os
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..runtime import interrupts
from ..runtime.errors import PathwaysError
from ..runtime.events import ClientSpec
from ..runtime.graph import ComputeNode
from ..runtime.objects import WAITS, Future
from ..runtime.resources import VirtualSlice, describe_axis_types
from . import args as specs
from . import attach, endings, segments, tenants
from . import cell as cells
from .display import Status
from .output import CellOutput
from .scope import DELETED
from .summary import summary_text


class CellTimeout(PathwaysError, TimeoutError):
    """A ``%%pathways --timeout S`` cell ran out of time and was cancelled."""


def _stop(taken: list, reason: str, cancelled: str) -> str:
    """Cancel the cell's run (``taken[0]``) after a Ctrl-C or ``--timeout``; what the cell's
    error says of it. Computations already launched are not recalled: they run to their end,
    as ``jax.jit`` calls already dispatched do, so the names they compute are bound to their
    futures (``taken[1]``), and the names of cancelled work keep what they held. (Binding
    none left ``w`` of ``w = step(w)`` with ``donate_argnums`` holding the buffers the running
    step consumed, and dropped the new state.) ``taken`` is emptied: the traceback IPython
    keeps must not hold the cell's futures."""
    run, bind = taken[0], taken[1] if len(taken) > 1 else None
    taken.clear()
    said = cancelled if run.cancel(reason) else "nothing was left to cancel"
    names = bind() if bind is not None else []
    if names:
        said += (f"; bound {', '.join(names)} to the futures of its computations already "
                 "launched (they run to their end)")
    return said


def _interrupted(what: str, taken: list) -> KeyboardInterrupt:
    """Cancel the cell's run after a Ctrl-C; the error the cell raises."""
    name = taken[0].name
    said = _stop(taken, "interrupted", f"cancelled the queued computations of program {name!r}")
    return KeyboardInterrupt(f"{what} interrupted: {said}; the kernel is ready for the next "
                             "cell.")


@magics_class
class PathwaysMagics(Magics):
    """The magics; ``state`` is the extension's per-kernel state (controller, names, client)."""

    def __init__(self, shell, state):
        super().__init__(shell)
        self.state = state
        self._submitted = 0  # programs the cells submitted (a split cell may submit none)
        self._read_arrays = False  # a plain statement of this cell read an array

    @property
    def ctl(self):
        return self.state.controller()

    # --- %pathways -------------------------------------------------------------------------
    @line_magic
    def pathways(self, line: str = ""):
        __tracebackhide__ = True
        a = specs.parse_line(line)
        self.state.sweep()
        return getattr(self, f"_cmd_{a.command}")(a)

    def _cmd_status(self, a) -> Status:
        return tenants.status_view(self.ctl, self.state.slice_names(), self.state.client.name)

    def _cmd_slice(self, a) -> None:
        old = self.state.slices.get(a.name)
        old = None if old is None or old.released or old.controller is not self.ctl else old
        try:  # (a name bound again: placed as though its old slice were given back)
            vs = self.ctl.slice(a.shape, island=a.island, axis_names=a.axes,
                                axis_types=a.axis_types, devices=a.devices, replacing=old)
        except (PathwaysError, ValueError) as e:
            fix = specs.as_flags(str(e), a.name)
            raise UsageError(f"%pathways slice {a.name}: {fix}") from None
        self.state.slices[a.name] = vs
        self.shell.user_ns[a.name] = vs
        dims = " x ".join(f"{n}={s}" for n, s in zip(vs.axis_names, vs.shape, strict=True))
        print(f"{a.name} = slice {dims} ({describe_axis_types(vs.axis_types)} axes) on island "
              f"{vs.island.id}, devices {list(vs.device_ids)}")

    def _cmd_release(self, a) -> None:
        vs = self.state.slices.pop(a.name, None) or self.shell.user_ns.get(a.name)
        if not isinstance(vs, VirtualSlice):
            known = sorted(self.state.slices) or ["(none yet)"]
            raise UsageError(f"%pathways release: {a.name!r} is not a slice; slices made here: "
                             f"{', '.join(known)}. Make one with %pathways slice NAME SHAPE.")
        vs.release()
        if self.shell.user_ns.get(a.name) is vs:  # (a name rebound since keeps its value)
            del self.shell.user_ns[a.name]
        print(f"released {a.name}")

    def _cmd_policy(self, a) -> None:
        self.ctl.policy = a.policy
        print(f"policy: {self.ctl.policy}")

    def _cmd_dispatch(self, a) -> None:
        self.ctl.dispatch = a.mode
        print(f"dispatch: {self.ctl.dispatch}")

    def _cmd_client(self, a) -> None:
        self.state.client = ClientSpec(name=a.name, weight=a.weight, priority=a.priority)
        print(f"client: {a.name} (weight {a.weight:g}, priority {a.priority}) for later cells")

    def _cmd_trace(self, a) -> None:
        if a.action == "clear":
            self.ctl.trace.clear()
            print("trace cleared")
            return
        n, where = len(self.ctl.trace), os.path.expanduser(a.path)  # (~/t.json, as a shell)
        try:
            path = self.ctl.trace.save(where, rows=a.rows or "auto")
        except ValueError as e:  # a path that names no file: the message says why, and the fix
            raise UsageError(f"%pathways trace save: {e}") from None
        except OSError as e:
            raise UsageError(f"%pathways trace save: cannot write {where!r} ({e.strerror}). "
                             "Pass a path in a folder that exists and that you may write to."
                             ) from None
        print(f"wrote {n} events to {path} (open it in https://ui.perfetto.dev)")

    def _cmd_reset(self, a) -> None:
        runs = self.ctl.runs()
        cancelled = self.ctl.cancel_all()
        released = self.state.release_all(self.shell.user_ns)
        print(f"reset: cancelled {cancelled} computations in {len(runs)} programs; released "
              f"{len(released)} slices" + (f" ({', '.join(released)})" if released else ""))

    def _cmd_attach(self, a) -> None:
        """Replace the kernel's controller (its slices released): ``a.backend``, ``a.pool``."""
        old = self.state.peek()  # None: not started yet, nothing to replace
        attach.check(a.backend, a.address, a.preset, a.pool, a.tenant, a.weight)
        lost = attach.held_by(old, self.shell.user_ns, self.shell.user_ns_hidden)
        if attach.leaves_first(old, a.backend, a.pool):
            self._leave(old)
            old = None
        new = attach.new_controller(a.backend, a.address, a.islands, a.preset, a.pool, old,
                                    a.tenant, a.weight)
        self._leave(old)
        new.set_default()  # pw.controller() hands out the new one from now on
        self.state.adopt(new)
        print(attach.attached_text(a.backend, a.address, a.pool, new, lost))

    def _leave(self, old) -> None:
        """Release the magic-made slices and close the kernel's old controller."""
        self.state.release_all(self.shell.user_ns)
        if old is not None:
            old.close()

    # --- %%pathways ------------------------------------------------------------------------
    @cell_magic("pathways")
    def pathways_cell(self, line: str, cell: str):
        __tracebackhide__ = True
        a = specs.parse_cell(line)
        self.state.sweep()
        if not cell.strip():
            raise UsageError("%%pathways: the cell is empty; put the code to run below the "
                             "%%pathways line.")
        source = f"%%pathways {line}".rstrip() + f"\n{cell}"  # as the history holds it
        count = _cell_number(self.shell, source)
        filename = self.shell.compile.cache(source, count, raw_code=source)
        try:
            ctl = self.ctl
            vs, temporary = self._slice_for(a)
            try:
                return self._run_cell(a, f"cell[{count}]", filename, cell, ctl, vs, temporary)
            finally:
                if temporary is not None and not self.state.keep(temporary):
                    temporary.release()
                    self.state.sweep()
        except (PathwaysError, KeyboardInterrupt) as e:  # (a timeout, a cancel, a Ctrl-C)
            cells.raise_in_cell(e, filename)  # the user's frames, or the %%pathways line

    def _slice_for(self, a) -> tuple[VirtualSlice | None, VirtualSlice | None]:
        if a.slice is not None:
            vs = self.shell.user_ns.get(a.slice, self.state.slices.get(a.slice))
            if not isinstance(vs, VirtualSlice):
                known = sorted(n for n, v in self.shell.user_ns.items() if isinstance(
                    v, VirtualSlice) and not v.released and not n.startswith("_"))
                held = "" if vs is None else f" ({a.slice} is of type {type(vs).__name__})"
                raise UsageError(
                    f"%%pathways: --slice {a.slice}: no slice named {a.slice!r}{held}"
                    + (f" (slices: {', '.join(known)})" if known else "")
                    + f". Make it with %pathways slice {a.slice} 2, or use --devices N.")
            if vs.released:
                raise UsageError(f"%%pathways: slice {a.slice!r} was released; make a new one "
                                 f"with %pathways slice {a.slice} SHAPE.")
            return vs, None
        if a.devices is not None:
            try:
                vs = self.ctl.slice(a.devices, island=a.island)
            except (PathwaysError, ValueError) as e:
                fix = specs.as_cell_flags(str(e))
                raise UsageError(f"%%pathways --devices {a.devices}: {fix}") from None
            return vs, vs
        return self.state.default_slice(), None

    def _run_cell(self, a, name: str, filename: str, cell: str, ctl, vs, temporary):
        """The cell as one program, or split where its Python needs values (segments.py)."""
        __tracebackhide__ = True
        body = self.shell.transform_cell(cell)
        # (IPython drops the leading blank lines: put them back, so lines are the cell's)
        lines = cell.splitlines()
        blank = next((i for i, t in enumerate(lines) if t.strip()), 0)
        body = "\n" * blank + body
        try:
            parts = segments.segments(body)
        except SyntaxError:
            parts = [segments.Segment(True, 1, len(body.splitlines()))]  # analyse() says why
        if len(parts) == 1 and parts[0].program:
            value = self._run_program(a, body, name, filename, ctl, vs, temporary, True)
            return None if segments.quiet(body) else value
        value, submitted, self._read_arrays = None, self._submitted, False
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            text = part.source(body)
            if part.program:
                value = self._run_program(a, text, f"{name}.{k}", filename, ctl, vs, temporary,
                                          last, quiet=True)
            else:
                value = self._run_plain(text, filename, vs, last, a.timeout, name)
        if self._submitted == submitted and not self._read_arrays:
            print(f"({name}: no array work in this cell; it ran as plain Python)")
        return None if segments.quiet(body) else value

    def _run_plain(self, text: str, filename: str, vs, last: bool,
                   timeout: float | None = None, name: str = "the cell"):
        """``text`` as plain Python; with ``--timeout``, a wait for a value that would end
        after S seconds raises ``CellTimeout`` (before, it waited without a limit)."""
        __tracebackhide__ = True
        old = WAITS.deadline
        WAITS.deadline = None if timeout is None else time.monotonic() + timeout
        try:
            value, arrays = segments.run_plain(text, self.shell.user_ns, filename, 1, vs, last)
        except UsageError:
            raise
        except KeyboardInterrupt as e:  # (a Ctrl-C in a long plain loop: say where it landed)
            raise segments.interrupted(e, name) from None
        except Exception as e:
            if timeout is not None and isinstance(e, TimeoutError) and \
                    time.monotonic() >= WAITS.deadline:
                raise CellTimeout(
                    f"did not end within --timeout {timeout:g} s: its Python, run as plain "
                    "Python (it reads values), waited for a value still being computed; the "
                    "computations it called run on (see ctl.status()). Raise --timeout, or "
                    "use a bigger slice.").with_traceback(e.__traceback__) from None
            raise cells.user_error(e, filename) from None
        finally:
            WAITS.deadline = old
        self._read_arrays = self._read_arrays or arrays
        return value

    def _run_program(self, a, body: str, name: str, filename: str, ctl, vs, temporary,
                     last: bool, quiet: bool = False):
        """``body`` (the cell, or one segment of it) as ONE program on the slice. A Ctrl-C
        from the moment the runtime took the program (``_submit`` names its run in ``taken``,
        with SIGINT held) to the end of the wait cancels it, wherever it lands."""
        __tracebackhide__ = True
        taken: list = []
        try:
            return self._program(a, body, name, filename, ctl, vs, temporary, last, quiet,
                                 taken)
        except KeyboardInterrupt as e:
            if not taken:  # (nothing submitted, or the program ended: nothing to cancel)
                raise
            e.__traceback__ = None  # (its frames hold the cell's futures; IPython keeps it)
            raise _interrupted(name, taken) from None
        except CellTimeout as e:
            if not taken or str(e) != name:  # (not ``_wait``'s: a plain statement's, as said)
                raise
            said = _stop(taken, f"timed out after {a.timeout:g} s", "cancelled its queued "
                         "computations (one already running ends first)")
            raise CellTimeout(f"{e} did not end within --timeout {a.timeout:g} s; {said}. "
                              "Raise --timeout, or use a bigger slice.") from None

    def _program(self, a, body: str, name: str, filename: str, ctl, vs, temporary,
                 last: bool, quiet: bool, taken: list):
        __tracebackhide__ = True
        shell = self.shell
        out = CellOutput(name)
        plan = cells.analyse(body, shell.user_ns, filename, 1, out.debug_print)
        mesh = None if plan.uses_pw else vs  # (compiled functions carry their own slices)
        if plan.mutable is not None:  # (nnx objects: changed in place, never traced here)
            return self._run_plain(body, filename, mesh, last, a.timeout, name)
        plain: dict[str, Any] = {}
        inputs = plan.inputs(shell.user_ns)
        program = cells.build_program(plan, vs, name, plain, inputs)
        client = self._client(a)
        try:
            with ctl.client(client.name, client.weight, client.priority), \
                    cells.ambient_mesh(None if plan.uses_pw else vs):
                # (compiled functions carry their own slices: no ambient mesh for them)
                try:
                    graph = program.trace(*inputs)
                except KeyboardInterrupt as e:  # (the cell's own Python, traced: its line)
                    raise KeyboardInterrupt(f"{name} interrupted while its Python ran; nothing "
                                            "of it was submitted").with_traceback(
                                                e.__traceback__) from None
                if not _has_work(graph):  # tracing ran the cell's Python: that was all of it
                    if segments.has_effects(graph):  # (only jax.debug.print: before, never run)
                        return segments.printed(ctl, lambda: self._run_plain(
                            body, filename, mesh, last, a.timeout, name))
                    self._bind(plain, None)
                    value = self._last(plan, plain, None)  # (a NameError there: no note)
                    if not quiet:
                        print(f"({name}: no array work in this cell; it ran as plain Python)")
                    return value
                futures, run = self._submit(ctl, graph, inputs, a.sequential, taken, temporary,
                                            plain)
                self._submitted += 1
        except (UsageError, KeyboardInterrupt):
            raise
        except Exception as e:
            if segments.needs_value(e):  # its Python needs a value: run it as plain Python
                # (compiled functions carry their own slices: no ambient mesh for them)
                return self._run_plain(body, filename, mesh, last, a.timeout, name)
            raise cells.user_error(e, filename) from None
        results = futures[0] if futures else {}
        view = self._show(a, ctl, run)
        if a.no_block and last:
            if getattr(shell, "kernel", None) is not None:
                out.detach()
            self.state.watch(out)
            deadline = endings.Deadline(run, a.timeout) if a.timeout is not None else None
            endings.when_done(run, results, lambda status: out.finish(
                deadline.finish(status) if deadline else status))
            taken.clear()  # its display sees its end: from here it runs on, as the cell said
            self._bind(plain, results)
            return self._last(plan, plain, results)
        try:
            self._wait(ctl, run, a.timeout, name, endings.leaves(results))
            taken.clear()  # ended, or an output failed: its error is the cell's, as raised
            failed = [f for f in endings.leaves(results) if f.exception(0) is not None]
            if failed:  # (result() raises it with its own traceback: not with the frames of
                try:  # an earlier raise of the same error, a print of a failed input, say)
                    failed[0].result(0)
                except BaseException as e:  # noqa: BLE001 - re-raised: the user's frames
                    raise cells.user_error(e, filename) from None
        except BaseException:
            results = futures = None  # the traceback must not keep the buffers alive
            raise
        finally:
            if a.viz and view is None:
                print(summary_text(ctl, run))
        self._bind(plain, results)
        return self._last(plan, plain, results)

    def _client(self, a) -> ClientSpec:
        base = self.state.client
        if a.client is None and a.weight is None and a.priority is None:
            return base
        same = a.client is None or a.client == base.name
        return ClientSpec(
            name=a.client or base.name,
            weight=a.weight if a.weight is not None else (base.weight if same else 1.0),
            priority=a.priority if a.priority is not None else (base.priority if same else 0))

    def _submit(self, ctl, graph, inputs, sequential: bool, taken: list, temporary,
                plain: dict[str, Any]):
        """Submit the whole cell at once; returns (output pytree in a list, the run). The run
        goes into ``taken`` (and a ``--devices`` slice's keep) before SIGINT is let through,
        so a Ctrl-C from then on finds what to cancel (see ``_run_program``), then what binds
        the cell's names (``_stop``)."""
        import dataclasses
        import functools

        import jax

        leaves = jax.tree_util.tree_leaves(inputs)
        n = len(graph.outputs)
        extra = []
        if n == 0:  # keep one value so the run can be reached (waited on, cancelled)
            produced = [v for node in graph.nodes if isinstance(node, ComputeNode)
                        for v in node.outputs]
            extra = produced[-1:]
        submitted = dataclasses.replace(graph, outputs=list(graph.outputs) + extra)
        with interrupts.held:  # (a Ctrl-C meanwhile is kept: the program is submitted whole)
            futs = ctl.submit(submitted, leaves, dispatch="sequential" if sequential else None)
            results = jax.tree_util.tree_unflatten(graph.out_tree, futs[:n])
            taken += [futs[0].run, functools.partial(self._bind, plain, results, True)]
            if temporary is not None:  # (released once the program ends: ``state.sweep``)
                self.state.temporary.append((futs[0].run, temporary))
        interrupts.raise_kept()  # (now, with the run in ``taken``: the caller cancels it)
        return [results], futs[0].run

    def _show(self, a, ctl, run):
        if not a.viz:
            return None
        try:
            from ..viz import ScheduleView
        except ImportError:
            return None
        if getattr(self.shell, "kernel", None) is None:
            return None  # a terminal: the text summary is the view
        from IPython.display import display

        try:
            view = ScheduleView(ctl, programs=[run.name], until=run)  # cell[N], to its end
        except Exception as e:  # the view is optional; the text summary always works
            print(f"(schedule view unavailable: {e}; showing the text summary)")
            return None
        display(view)
        return view

    def _wait(self, ctl, run, timeout: float | None, name: str,
              outputs: list[Future]) -> None:
        """Until the program ends, or an output failed (a cancel from the sidebar, say): then
        the cell fails at once, and computations already launched end on their own. A Ctrl-C
        meanwhile cancels the program (``_run_program``)."""
        __tracebackhide__ = True
        deadline = None if timeout is None else time.monotonic() + timeout
        resolved = endings.all_resolved(outputs)
        if getattr(ctl.executor, "virtual", False):  # a simulated clock: the cell's program
            run.wait(timeout)  # runs to its end while this thread waits (no real time passes)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            # ended first: a run that ended by the deadline did not time out (a simulated
            # one runs to its end inside run.wait, however long that takes in real time)
            if run.done() or (resolved.is_set() and any(
                    f.exception(0) is not None for f in outputs)):
                return
            if left is not None and left <= 0:  # (cancelled by ``_run_program``)
                raise CellTimeout(name)
            # short steps: a long --timeout never overflows a wait, Ctrl-C is seen
            (run if resolved.is_set() else resolved).wait(
                0.5 if left is None else min(left, 0.5))

    def _bind(self, plain: dict[str, Any], results: Any, launched: bool = False) -> list[str]:
        """Bind the cell's names, all of them: a Ctrl-C meanwhile is raised once they are
        (before, one that landed between two names left the cell half bound). ``launched``:
        its program was cancelled; only the names whose futures all still get their values,
        if any does (``_stop``). Returns the names bound."""
        ns = self.shell.user_ns
        bound = cells.bound_values(plain, results)
        if launched:
            ok = {k: endings.launched(v) for k, v in bound.items() if k != cells.LAST}
            bound = ({k: v for k, v in bound.items() if ok.get(k) is not False}
                     if any(ok.values()) else {})
        with interrupts.held:
            for key, value in bound.items():
                if key == cells.LAST:
                    continue
                if value is DELETED:
                    ns.pop(key, None)
                else:
                    ns[key] = value
        return [k for k in bound if k != cells.LAST]

    def _last(self, plan, plain: dict[str, Any], results: Any):
        __tracebackhide__ = True
        if plan.last_name is not None:
            if plan.last_name not in self.shell.user_ns:  # as Python evaluates it: at the end,
                # on the cell's line (a builtin, or a NameError whose traceback is that line)
                line = "\n" * (plan.last_line - 1) + plan.last_name
                return eval(compile(line, plan.filename, "eval"), self.shell.user_ns)
            return self.shell.user_ns[plan.last_name]
        return cells.bound_values(plain, results).get(cells.LAST)


PathwaysMagics.pathways.__doc__ = (
    "%pathways SUBCOMMAND: inspect and steer the Pathways controller (see docs/magics.md).\n\n"
    + specs.help_text(specs.LINE))
PathwaysMagics.pathways_cell.__doc__ = (
    "%%pathways [options]: run the cell as ONE Pathways program (see docs/magics.md).\n\n"
    + specs.help_text(specs.CELL))


def _has_work(graph) -> bool:
    """True when the traced cell computes something: a node that produces values."""
    return bool(graph.outputs) or any(isinstance(node, ComputeNode) and node.outputs
                                      for node in graph.nodes)


def _cell_number(shell, source: str) -> int:
    """The number the notebook shows for the running cell (``In [N]``): IPython has already
    counted it when it keeps history, so a cell stored under N runs with the count at N+1."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if history and history[-1].rstrip("\n") == source.rstrip("\n"):
        return len(history) - 1
    return shell.execution_count
