"""Rich displays: HTML in notebooks, readable text in terminals.

The runtime classes stay free of notebook code; the extension registers these functions as
IPython formatters for ``pw.Future``, ``pw.Controller`` and ``pw.VirtualSlice``, and
``%pathways status`` returns a ``Status`` object that renders itself.

>>> print(future_text(fut))          # doctest: +SKIP
Future cell[3]: float32[8] P('x',) over x=4 on island 0 devices [0, 1, 2, 3] - done in 2.1 ms
"""

from __future__ import annotations

import html
import time
from typing import Any

import jax
import numpy as np

from ..runtime.errors import NoValueError
from ..runtime.objects import Future, FutureState
from ..runtime.resources import VirtualSlice, describe_axis_types
from ..runtime.snapshot import SliceView, Snapshot
from ..runtime.units import device_ids, human_bytes, human_seconds
from .state import current

_TABLE = ('<table style="border-collapse:collapse;font-family:monospace;font-size:12px">'
          '{head}{rows}</table>')


def _table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f'<th style="text-align:left;padding:2px 8px">{html.escape(h)}</th>'
                 for h in header)
    body = "".join("<tr>" + "".join(f'<td style="padding:2px 8px">{html.escape(str(c))}</td>'
                                    for c in row) + "</tr>" for row in rows)
    caption = f"<b>{html.escape(title)}</b>" if title else ""
    return caption + _TABLE.format(head=f"<tr>{th}</tr>", rows=body)


def _text_table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    return "\n".join(([title] if title else []) + lines)


# --- futures -------------------------------------------------------------------------------
def future_fields(fut: Future) -> dict[str, str]:
    """What a Future shows: shape, dtype, sharding, state, where, elapsed, and a preview."""
    sh = fut.sharding
    spec = getattr(sh, "spec", None)
    mesh = getattr(sh, "mesh", None)
    layout = "host"
    if sh is not None:
        axes = ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items()) if mesh else ""
        layout = f"{spec} over {axes}" if spec is not None else type(sh).__name__
    where = "host"
    if sh is not None:
        where = f"island {fut.island} devices {device_ids(d.id for d in sh.device_set)}"
    run = fut.run
    start = run.t_submit if run is not None else fut.t_created
    if fut.done():
        elapsed = f"in {human_seconds(max(0.0, fut.t_done - start))}" if fut.t_done else ""
    else:
        clock = run.owner.now if run is not None else time.perf_counter
        elapsed = f"for {human_seconds(max(0.0, clock() - start))}"
    preview = ""
    if fut.state is FutureState.DONE:
        try:
            preview = _preview(fut.result(0))
        except NoValueError:
            preview = "(simulated: shape and times only, no values)"
        except Exception:  # closed controller: nothing to show
            preview = "(freed)"
    elif fut.state in (FutureState.FAILED, FutureState.CANCELLED):
        preview = f"{type(fut.exception(0)).__name__}: {fut.exception(0)}"
    dims = ",".join(str(d) for d in fut.shape)
    return {"name": fut.name or "?", "type": f"{fut.dtype}[{dims}]", "sharding": layout,
            "where": where, "state": f"{fut.state.value} {elapsed}".strip(),
            "program": f"{run.name} (run {run.id}, client {run.client})" if run else "",
            "value": preview}


def _preview(value) -> str:
    """A few of ``value``'s elements; a typed PRNG key array (``jax.random.key``), which NumPy
    cannot hold, shows the key data it wraps, as its ``repr`` does."""
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended):
        return "key data " + _preview(jax.random.key_data(value))
    return np.array2string(np.asarray(value), threshold=8, edgeitems=2, precision=4)


def future_text(fut: Future) -> str:
    f = future_fields(fut)
    text = (f"Future {f['name']}: {f['type']} {f['sharding']} on {f['where']} - {f['state']}")
    return text + (f"\n  {f['value']}" if f["value"] else "")


def _hosted():
    """The controller this kernel hosts, if it has started (never starts one)."""
    st = current()
    return None if st is None else st.peek()


def _island_of(ctl) -> dict[int, int]:
    if ctl is None or ctl.closed:
        return {}
    return {d.id: isl.id for isl in ctl.islands for d in isl.devices}


def layout_html(shape, sharding, ctl=None) -> str:
    """The picture of an array's layout (``pwkernel.viz.sharding``), devices named by island."""
    from ..viz.sharding import sharding_html

    return sharding_html(shape, sharding, _island_of(ctl if ctl is not None else _hosted()))


def future_html(fut: Future) -> str:
    f = future_fields(fut)
    table = _table(f"Future {f['name']}", ["field", "value"],
                   [[k, v] for k, v in f.items() if k != "name" and v])
    return table + (layout_html(fut.shape, fut.sharding) if fut.sharding is not None else "")


def array_html(arr) -> str | None:
    """A ``jax.Array`` on the hosted controller's devices: its type, layout and a preview,
    with the picture; None (JAX's own display) for any other array."""
    ctl = _hosted()
    islands = _island_of(ctl)
    try:
        ids = {d.id for d in arr.sharding.device_set}
        on = {islands.get(i) for i in ids}
    except Exception:  # a deleted or unusual array: JAX's own display
        return None
    if not ids or len(on) != 1 or None in on:
        return None
    sharding = arr.sharding
    spec = getattr(sharding, "spec", None)
    dims = ",".join(str(d) for d in arr.shape)
    try:
        preview = _preview(arr)
    except Exception:  # deleted buffer
        preview = "(deleted)"
    rows = [["type", f"{arr.dtype}[{dims}]"],
            ["sharding", str(spec) if spec is not None else type(sharding).__name__],
            ["where", f"island {on.pop()} devices {device_ids(ids)}"], ["value", preview]]
    return _table("jax.Array", ["field", "value"], rows) + layout_html(arr.shape, sharding, ctl)


# --- slices and controllers -----------------------------------------------------------------
def _slice_row(vs: SliceView, name: str = "") -> list[Any]:
    dims = " x ".join(f"{n}={s}" for n, s in zip(vs.axis_names, vs.shape, strict=True))
    return [name or f"#{vs.id}", dims, describe_axis_types(vs.axis_types), vs.island,
            device_ids(vs.device_ids)]


def _virtual_slice_row(vs: VirtualSlice) -> list[Any]:
    return [f"#{vs.id}", "released", "", "", ""] if vs.released else _slice_row(SliceView.of(vs))


_SLICE_HEAD = ["slice", "mesh", "axis types", "island", "devices"]


def slice_text(vs: VirtualSlice) -> str:
    return _text_table(f"VirtualSlice {vs.id}", _SLICE_HEAD, [_virtual_slice_row(vs)])


def slice_html(vs: VirtualSlice) -> str:
    return _table(f"VirtualSlice {vs.id}", _SLICE_HEAD, [_virtual_slice_row(vs)])


def _island_rows(snap: Snapshot) -> list[list[Any]]:
    return [[i.id, i.platform, device_ids(i.device_ids),
             sum(vs.island == i.id for vs in snap.slices), i.running, i.queued]
            for i in snap.islands]


_ISLAND_HEAD = ["island", "platform", "devices", "slices", "running", "queued"]


def controller_text(ctl) -> str:
    snap = ctl.snapshot()
    if snap.closed:
        return "Controller(closed)"
    title = f"Controller (policy {snap.policy}, dispatch {snap.dispatch})"
    return _text_table(title, _ISLAND_HEAD, _island_rows(snap))


def controller_html(ctl) -> str:
    snap = ctl.snapshot()
    if snap.closed:
        return "<code>Controller(closed)</code>"
    title = f"Controller (policy {snap.policy}, dispatch {snap.dispatch})"
    return _table(title, _ISLAND_HEAD, _island_rows(snap))


def _memory_rows(snap: Snapshot, most: int = 64) -> list[list[Any]]:
    """A row per device; past ``most`` devices (a simulated pod), consecutive devices of one
    platform holding the same bytes share a row (``[0-1023]``)."""
    platform = {d: i.platform for i in snap.islands for d in i.device_ids}
    rows = [[d, platform.get(d, ""), human_bytes(n)] for d, n in snap.memory.items()]
    if len(rows) <= most:
        return rows
    groups: list[list[Any]] = []
    for d, where, held in rows:
        last = groups[-1] if groups else None
        if last and last[1] == where and last[2] == held and last[0][-1] == d - 1:
            last[0].append(d)
        else:
            groups.append([[d], where, held])
    return [[device_ids(ids), where, held] for ids, where, held in groups]


# --- %pathways status ----------------------------------------------------------------------
class Status:
    """What ``%pathways status`` shows of a controller's snapshot: HTML or text."""

    def __init__(self, ctl, names: dict[int, str] | None = None, client: str = "default"):
        self.snapshot = ctl.snapshot()
        self.names = names or {}
        self.client = client

    def _sections(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        snap = self.snapshot
        slices = [_slice_row(vs, self.names.get(vs.id, "")) for vs in snap.slices]
        progs = [[r.id, r.name, r.client, r.state] for r in snap.runs]
        return [
            (f"Controller: policy {snap.policy}, dispatch {snap.dispatch}, client {self.client}",
             _ISLAND_HEAD, _island_rows(snap)),
            ("Slices", _SLICE_HEAD, slices),
            ("Programs (queued or running)", ["run", "program", "client", "state"], progs),
            ("Memory per device", ["device", "platform", "held"], _memory_rows(snap)),
        ]

    def __repr__(self) -> str:
        if self.snapshot.closed:
            return "Pathways controller: closed"
        parts = []
        for title, head, rows in self._sections():
            parts.append(_text_table(title, head, rows) if rows else f"{title}: none")
        return "\n\n".join(parts)

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        if self.snapshot.closed:
            return "<code>Pathways controller: closed</code>"
        return "".join(_table(t, h, r) if r else f"<p><b>{html.escape(t)}</b>: none</p>"
                       for t, h, r in self._sections())


def register(ip) -> None:
    """Register the formatters for the runtime's classes with ``ip``."""
    from ..runtime.controller import Controller

    plain = ip.display_formatter.formatters["text/plain"]
    rich = ip.display_formatter.formatters["text/html"]
    for cls, text, htm in ((Future, future_text, future_html),
                           (VirtualSlice, slice_text, slice_html),
                           (Controller, controller_text, controller_html)):
        plain.for_type(cls, lambda obj, p, cycle, _t=text: p.text(_t(obj)))
        rich.for_type(cls, htm)
    rich.for_type(jax.Array, array_html)  # only arrays on the controller's devices


def unregister(ip) -> None:
    from ..runtime.controller import Controller

    for fmt in ("text/plain", "text/html"):
        formatter = ip.display_formatter.formatters[fmt]
        for cls in (Future, VirtualSlice, Controller, jax.Array):
            formatter.type_printers.pop(cls, None)
