"""The local executor: islands are this process's JAX devices, and work runs where it is decided.

Launching: a computation is called (its jit object's C++ dispatch) by the thread that handed
it over, in decision order; JAX dispatches asynchronously, so this returns at once. A
computation that calls back into Python (which XLA may run synchronously in the launching
thread) is launched by one of the island's worker threads instead.

Seeing completions, without a thread hand-off where possible: right after a launch, if the
outputs are already ready (XLA's CPU client runs small computations within the call) and
nothing launched before is still being watched on those devices, the completion is reported at
once, from the launching thread. Otherwise the launch is queued for the watcher thread of its
device set (one thread per set of devices that ever ran work, joined at ``close()``), which
waits on its fence (``block_until_ready``) and reports the completion. This backend only says
"completed, seen at t" (``Task.completed``): the runtime reports the end in launch order and
after the inputs' ends (``runtime/ends.py``), so a watcher never waits for anything but its own
launches' fences.

Transfers are ``jax.device_put`` onto the destination layout, started at once (the source may
still be computing); one ready at once completes at once, others are watched by the transfer
threads, which hold emulated DCN copies to the link model (which starts one at its source's end).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from ...runtime.callbacks import checks_values, failure, invalid_values
from ...runtime.errors import copy_error, deleted_input, donated_and_read_in, launch_error
from ...runtime.executor import IslandFacts, NoGroup
from ...runtime.resources import DEFAULT_ISLANDS, Island
from ...runtime.tasks import Task
from ...runtime.trace import LinkKind
from ...runtime.transfer import Link, TransferEngine, copy_onto
from .devices import discover

_now = time.perf_counter
get_ident = threading.get_ident
_DCN = LinkKind.DCN.value
_PATIENCE = 5e-4  # s a watcher leaves an end to the thread that keeps launching there
_IDLE = 2e-2  # s without launches after which a watcher sleeps until woken


@contextlib.contextmanager
def _released(lock):
    try:
        yield
    finally:
        lock.release()


class LocalBackend(NoGroup):
    """Islands of the JAX devices this process sees (``backend="local"``, the default).

    >>> ex = LocalBackend(islands=(4, 4))        # doctest: +SKIP
    >>> ctl = pw.Controller(backend=ex)           # doctest: +SKIP
    """

    name = "local"
    program_ahead = False
    launch_holds_inputs = True  # (a jax.Array's buffer lives while a launch reads it)
    batches_uploads = True  # (a call's host values go up in one device_put: ``_upload``)

    def __init__(self, islands: Sequence[int] | None = DEFAULT_ISLANDS, dcn: Link | None = None):
        if dcn is not None and not isinstance(dcn, Link):
            raise TypeError(f"dcn must be a pw.Link(bandwidth=..., latency=...) or None, got "
                            f"{type(dcn).__name__}.")
        self.islands: tuple[Island, ...] = tuple(discover(islands))
        self.transfers = TransferEngine(dcn)
        self._sites = {isl.id: _Site(isl) for isl in self.islands}

    now = staticmethod(_now)

    def prepare(self, plan) -> None:
        """Nothing to do: executables are already compiled for this process's devices."""

    # --- computations ----------------------------------------------------------------------
    def launch(self, island: int, tasks: Sequence[Task]) -> None:
        site = self._sites[island]
        for task in tasks:
            node = task.node
            waits = node.exe.donated and _waits(task)
            if node.asynchronous and not waits:
                self._launch(site, task)
            else:  # (a donating launch that waits for its inputs' ends waits there)
                site.spawn(self._launch, site, task, waits)

    def _launch(self, site: _Site, task: Task, waits: bool = False) -> None:
        node = task.node
        if node.exe.donated:
            error = _donatable(task, waits)
            if error is not None:  # nothing donated: the inputs stay valid
                site.watch(task, None, error)
                return
        inputs = task.inputs()
        error = _unusable(node, inputs)
        if error is not None:
            site.watch(task, None, error)
            return
        t_launch = task.t_launch = _now()
        try:
            outs = node.call(*inputs)
        except BaseException as e:  # noqa: BLE001 - a failed launch fails its outputs
            site.watch(task, None, launch_error(e, node.name))
            return
        # (jax_debug_nans / jax_debug_infs: a NaN fails the launch as it fails jax.jit's call)
        if checks_values() and (invalid := invalid_values(outs, node.name)) is not None:
            site.watch(task, None, invalid)
            return
        inputs = None  # (a donated input is the callee's now)
        watcher = site.watchers.get(node.devices)
        if watcher is not None:
            watcher.last_launch, watcher.last_launcher = t_launch, get_ident()
        # Seen to complete now, with no hand-off, if the outputs are ready already (nothing
        # launched before it here is still watched).
        if node.asynchronous and (watcher is None or not watcher.outstanding
                                  or watcher.help()) and _ready(outs):
            # (an error raised while it ran, XLA's out of memory, ...: its outputs are ready
            # and hold it; reading them raises it, and so do its futures: ``failure``.
            # Asking the fence here would cost every launch a wait, and the GIL with it.)
            task.completed(_now(), failure(outs), outs)  # (a host callback's exception)
            return
        site.watch(task, outs, None)  # queued before any consumer can be launched behind it
        task.launched(outs)

    def expedite(self, task: Task, timeout: float | None = None) -> None:
        """A thread waits for ``task``'s outputs (and so launches nothing meanwhile): the
        watcher of its devices reports ends at once, not leaving them to a launching thread."""
        node = task.node
        if not node.is_compute:
            return
        watcher = self._sites[node.island].watchers.get(node.devices)
        if watcher is not None and watcher.outstanding:
            watcher.hurry()

    # --- transfers -------------------------------------------------------------------------
    def transfer(self, task: Task) -> None:
        node = task.node
        if len(node.outputs) > 1:
            self._upload(task)
            return
        try:
            out = copy_onto(task.inputs()[0], node.sharding)  # (never waits for its source)
            if task.graph_node.shares_buffers:
                # JAX reuses the source's buffer where a device holds the same block in both
                # layouts, whatever may_alias says; the runtime frees this output after its
                # last reader, and the source may be the user's: copy those (async), laid
                # out as the future says (a copy normalizes P() to P(None,))
                out = jax.device_put(out.copy(), node.sharding, may_alias=True)
        except BaseException as e:  # noqa: BLE001
            error = copy_error(node.name, task.inputs()[0], e)
            self.transfers.submit(self._land, task, None, error)
            return
        if not self._emulated(task):
            if _is_ready(out):
                task.completed(_now(), None, [out])
                return
            task.launched([out])  # an emulated link releases it only when it lands
        self.transfers.submit(self._land, task, [out], None)

    def _upload(self, task: Task) -> None:
        """Several host values of one call (``Graph.upload``): one ``jax.device_put``."""
        node, values = task.node, task.inputs()
        try:
            outs = jax.device_put(values, list(node.shardings), may_alias=False)
        except Exception as e:  # noqa: BLE001 - the value that cannot go up fails the copy
            self.transfers.submit(self._land, task, None, _upload_error(node, values, e))
            return
        except BaseException as e:  # noqa: BLE001 - (an interrupt: no value is tried again)
            self.transfers.submit(self._land, task, None, e)
            return
        if all(map(_is_ready, outs)):
            task.completed(_now(), None, outs)
            return
        task.launched(outs)
        self.transfers.submit(self._land, task, outs, None)

    def _emulated(self, task: Task) -> bool:
        """A copy the DCN link model holds until it lands."""
        return self.transfers.dcn is not None and task.graph_node.link == _DCN

    def _land(self, task: Task, outs: list | None, error) -> None:
        if error is None:
            try:
                for out in outs:  # (not jax.block_until_ready: no pytree walk per copy)
                    out.block_until_ready()
            except BaseException as e:  # noqa: BLE001
                error = e
        if error is not None or not self._emulated(task):
            task.completed(_now(), error, outs)
            return
        t_inputs = task.inputs_ended()
        if t_inputs is None:
            # The link model starts the copy at its source's end, not reported yet: waiting
            # for it here could take every transfer worker, so its own thread waits.
            self.transfers.wait_apart(self._landed, task, outs, None)
            return
        self._landed(task, outs, t_inputs)

    def _landed(self, task: Task, outs: list, t_inputs: float | None) -> None:
        """Hold an emulated DCN copy until the link model says it landed."""
        if t_inputs is None:
            t_inputs = task.inputs_ended(None)
        begin = max(task.t_launch, t_inputs)
        g = task.graph_node
        self.transfers.delay(g.link, g.src, g.dst, g.nbytes, begin)
        task.completed(_now(), None, outs, t_start=begin)

    # --- the rest of the interface ---------------------------------------------------------
    def fetch(self, value, sharding) -> Any:
        return value

    @staticmethod
    def failure(value) -> BaseException | None:
        """The error ``value`` holds if the launch that made it failed while it ran (seen
        ready at once, its end reported no error): XLA keeps it in the outputs."""
        if getattr(value, "is_deleted", None) is None or value.is_deleted():
            return None  # (not an array, or donated since: nothing to ask)
        try:
            value.block_until_ready()
        except Exception as e:  # noqa: BLE001 - the value's own error, handed to its future
            return e
        return None

    def status(self, island: int) -> IslandFacts:
        return IslandFacts()

    def reattach(self, island: int) -> Island:
        raise ValueError("reattach() is for backend='ray': the local backend's islands "
                         "live in this process and cannot be lost.")

    def close(self) -> None:
        for site in self._sites.values():
            site.close()
        self.transfers.shutdown()


def _upload_error(node, values: list, error: Exception) -> BaseException:
    """What an upload of several values fails with: the error of the first one that cannot
    go up on its own, as if it had been copied alone (``copy_error``)."""
    for value, sharding in zip(values, node.shardings, strict=True):
        try:
            jax.device_put(value, sharding, may_alias=False)
        except Exception as e:  # noqa: BLE001
            return copy_error(node.name, value, e)
    return copy_error(node.name, values[0], error)


def _donatable(task: Task, waits: bool) -> BaseException | None:
    """Wait, if need be, before a launch that donates (consumes) its inputs; returns an input's
    error, and then nothing is donated.

    A computation's end is watched on its fence (``runtime/callbacks.py``), never on the
    buffers a consumer may donate, so donating a value still being computed is safe, and a
    donating launch goes at once, behind its producers, as under ``jax.jit``. It waits for its
    inputs' ends in two cases: an input's producer has host callbacks (its failure is known
    only at its end, after its outputs are ready) or a donated input comes from a transfer (a
    transfer thread waits on that very buffer). Such a launch runs on a worker thread, never on
    a watcher that may itself have to report the end it waits for."""
    if waits:
        for producer in task.producers():
            producer.expedite()  # its watcher reports it at once
        task.inputs_ended(None)
    return task.input_error()


def _unusable(node, inputs: list) -> BaseException | None:
    """The error for inputs XLA's compiled call would crash the process on, where ``jax.jit``
    raises (or should): one that is gone (an earlier call was given it, ``donate_argnums``,
    or it was deleted), or one a donating call both gives away and reads."""
    try:  # (one pass, as cheap as it gets, where every input is an array: the common case)
        gone = any([value.is_deleted() for value in inputs])
    except AttributeError:  # (an input that is not an array: nothing to check on it)
        gone = True
    for i, value in enumerate(inputs) if gone else ():
        is_deleted = getattr(value, "is_deleted", None)
        if is_deleted is not None and is_deleted():
            return deleted_input(
                f"input {i} of {node.name} was given to an earlier call that donates it, "
                "which now owns its buffer (or it was deleted)", value.aval.str_short())
    donated = node.exe.donated
    return (donated_and_read_in(node.name, inputs, donated, names=lambda: node.exe.input_names)
            if donated else None)


def _waits(task: Task) -> bool:
    """Whether a donating launch must wait for its inputs' ends (see ``_donatable``)."""
    if task.inputs_ended() is not None:
        return False
    for t in task.producers(running=False):  # (ended, its error maybe not yet recorded)
        if not t.node.asynchronous:
            return True
    # made by a copy (of this run, or of the run it comes from)?
    return task.donates_a_copy()


def _is_ready(value) -> bool:
    """``value.is_ready()``; a typed key array (``jax.random.key``) has none: its key data's;
    a ``float0`` value (a gradient's of an int) stays a host value, as ``jax.device_put``
    leaves it: ready."""
    ready = getattr(value, "is_ready", None)
    if ready is not None:
        return ready()
    return not isinstance(value, jax.Array) or jax.random.key_data(value).is_ready()


def _ready(outs) -> bool:
    """The launch has run: its fence is ready (see ``LaunchOutputs``)."""
    return outs.fence.is_ready()


def _block(outs) -> None:
    """Wait until the launch has run, on its fence: never on an output, which a later launch
    may have been given (donated) meanwhile."""
    outs.fence.block_until_ready()


def _observe(task: Task, outs, error, t_ready: float | None = None) -> None:
    """Report that a launched computation completed, seen at ``t_ready`` (or now)."""
    if error is None:
        try:
            _block(outs)
        except BaseException as e:  # noqa: BLE001
            error = e
        else:  # what a host callback raised (its outputs are ready: it has run)
            error = failure(outs)
    task.completed(_now() if t_ready is None else t_ready, error, outs)


class _Site:
    """One island's threads: workers for computations that may run synchronously, and one
    watcher per device set."""

    def __init__(self, island: Island):
        self.island = island
        self._lock = threading.Lock()
        self.watchers: dict[tuple[int, ...], _Watcher] = {}  # by device set
        self._closing = False
        self._workers = ThreadPoolExecutor(len(island.devices),
                                           thread_name_prefix=f"pw-island{island.id}")

    def spawn(self, fn, *args) -> None:
        try:
            self._workers.submit(fn, *args)
        except RuntimeError:  # closing: the pool takes no more work, so do it here
            fn(*args)

    def watch(self, task: Task, outs, error) -> None:
        """Queue a launched computation to be seen ending by the watcher of its devices."""
        devices = task.node.devices
        watcher = self.watchers.get(devices)
        if watcher is None:
            with self._lock:
                watcher = None if self._closing else self.watchers.get(devices)
                if watcher is None and not self._closing:
                    watcher = self.watchers[devices] = _Watcher(
                        f"pw-island{self.island.id}-watch-{'.'.join(map(str, devices))}")
        if watcher is None:  # closing: no new threads; see it complete here
            _observe(task, outs, error)
        else:
            watcher.put(task, outs, error)

    def close(self) -> None:
        self._workers.shutdown(wait=True)
        with self._lock:
            self._closing = True
            watchers = list(self.watchers.values())
        for watcher in watchers:
            watcher.close()


class _Watcher:
    """A thread that sees the computations launched on one device set complete, in launch
    order.

    The thread that launches more work on the device set, or waits for a result of it, may
    report completions too (``help``): whatever is at the head of the queue and already ready is
    reported right there, in order. One reporter at a time (``_observing``); this thread takes
    it only once the head's outputs are ready (noting when: that is the end's time, whoever
    reports it), so a helper never waits behind a computation still running."""

    def __init__(self, name: str):
        self._queue: collections.deque = collections.deque()  # [task, outs, error, t_ready]
        # (entered as the plain lock where nobody waits: a Condition's own enter and exit
        # are Python calls, five per computation)
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._observing = threading.Lock()
        self._owner: int | None = None  # the thread reporting ends now
        self._closed = False
        self.outstanding = self.popped = 0  # queued and not yet reported; taken off, ever
        self.last_launch = 0.0  # when work was last launched here, and by which thread
        self.last_launcher: int | None = None
        self._asleep = False  # waiting without a timeout: a put must wake it
        # the entry this thread waits on outside the reporting lock: no helper reports it
        # meanwhile (once reported, its readers may end and free its outputs, and a buffer
        # deleted under that wait crashes XLA's client)
        self._waiting: list | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, task: Task, outs, error) -> None:
        with self._mutex:
            self.outstanding += 1
            self._queue.append([task, outs, error, None])
            if self._asleep:  # (awake, it looks again within _PATIENCE)
                self._changed.notify()

    def help(self) -> bool:
        """Report the ends at the head of the queue that need no waiting (after the end being
        reported now, if any); True when nothing launched here is left to report."""
        me = threading.get_ident()
        if self._owner == me or not self._observing.acquire(blocking=False):
            return False  # being reported (by this thread further up its stack, or another)
        with _released(self._observing):
            self._owner = me
            try:
                queue = self._queue
                while queue:
                    entry = queue[0]
                    task, outs, error, t_ready = entry
                    if entry is self._waiting:
                        return False  # the watcher waits on it: it reports it
                    if error is None and t_ready is None and not _ready(outs):
                        return False
                    with self._mutex:
                        queue.popleft()
                        self.popped += 1
                    _observe(task, outs, error, t_ready)
                    with self._mutex:
                        self.outstanding -= 1
                return not self.outstanding
            finally:
                self._owner = None

    def hurry(self) -> None:
        """Nobody is about to launch here (a thread waits for a result): report at once."""
        with self._mutex:
            self.last_launch = 0.0
            self._changed.notify()

    def _run(self) -> None:
        observe, queue, me = _observe, self._queue, threading.get_ident()
        while True:
            with self._mutex:
                while not queue and not self._closed:
                    # While work is launched here, look again every _PATIENCE (a put then
                    # needs no wake-up); idle for long, sleep until a put wakes it.
                    if _now() - self.last_launch > _IDLE:
                        self._asleep = True
                        self._changed.wait()
                        self._asleep = False
                    else:
                        self._changed.wait(_PATIENCE)
                if not queue:
                    return
                entry = self._waiting = queue[0]
            if entry[2] is None:  # wait for the data without holding up a helper
                try:
                    _block(entry[1])
                except BaseException:  # noqa: BLE001 - observe() reports it
                    pass
            with self._mutex:
                self._waiting = None
                entry[3] = entry[3] or _now()  # seen ready now (a helper reports it with this)
                # Another thread still launching here reports it at its next launch: leave it
                # that long, holding no task (its run may end meanwhile): ``popped`` tells.
                head, entry = self.popped, None
                while (queue and self.popped == head and not self._closed
                       and self.last_launcher != me):
                    idle = _now() - self.last_launch
                    if idle >= _PATIENCE:
                        break
                    self._changed.wait(_PATIENCE - idle)
            with self._observing:
                self._owner = me
                with self._mutex:
                    if queue and self.popped == head:  # (else a helper reported it meanwhile)
                        entry = queue.popleft()
                        self.popped += 1
                if entry is not None:
                    observe(*entry)
                    entry = None  # (before another reporter may end a later run)
                    with self._mutex:
                        self.outstanding -= 1
                self._owner = None

    def close(self) -> None:
        """Finish what is queued, then stop."""
        with self._mutex:
            self._closed = True
            self._changed.notify()
        self._thread.join()
