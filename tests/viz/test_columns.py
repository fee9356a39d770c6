"""The pure events -> columns layer of the live views, fed by a real controller's trace."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.palettes import Colorblind8

from pwkernel.viz import columns as C
from pwkernel.viz import encoding as E
from pwkernel.viz.palette import COLORS, FAILED_COLOR, LINK_COLORS, OKABE_ITO, ColorRegistry
from tests.helpers.programs import make_programs, run


@pytest.fixture
def events(ctl):
    fig2, local = make_programs(ctl)
    run(fig2)
    with ctl.client("alice"):
        run(local)
    ctl.wait(10.0)
    evs = ctl.trace.events()
    assert evs, "the programs recorded no events"
    return evs


def test_one_bar_per_device_on_its_own_row(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    compute = [e for e in events if e.kind == "compute"]
    cols = C.rectangles(compute, layout, t0=events[0].t_submit)
    assert C.length(cols) == sum(len(e.devices) for e in compute)
    for device, y, kind in zip(cols["device"], cols["y"], cols["kind"], strict=True):
        assert kind == "compute"
        assert y == pytest.approx(layout.row(device) + C.COMPUTE_OFFSET)
    # Every device of the computation appears, and times are relative to t0 and ordered.
    assert set(cols["device"]) == {d for e in compute for d in e.devices}
    assert all(0 <= lo <= hi for lo, hi in zip(cols["left"], cols["right"], strict=True))


def test_rows_are_grouped_by_island(ctl):
    layout = C.DeviceLayout.from_controller(ctl)
    island0 = [layout.row(d) for d in ctl.islands[0].device_ids]
    island1 = [layout.row(d) for d in ctl.islands[1].device_ids]
    assert max(island0) < min(island1)
    # The gap between islands is larger than between devices of one island.
    assert min(island1) - max(island0) > island0[1] - island0[0]
    assert layout.labels[layout.row(5)] == "island 1 · device 5"


def test_transfers_inside_and_between_islands(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    moved = [e for e in events if e.kind == "transfer"]
    kinds = {e.link for e in moved}
    assert {"ici", "dcn"} <= kinds, f"expected ICI and DCN transfers, got {kinds}"
    segs = C.links(moved, layout, t0=0.0)
    island_of = {d: isl.id for isl in ctl.islands for d in isl.device_ids}
    for link, s, d in zip(segs["link"], segs["src_device"], segs["dst_device"], strict=True):
        same_island = island_of[s] == island_of[d]
        assert same_island == (link == "ici"), (link, s, d)
    for y0, y1, s, d in zip(segs["y0"], segs["y1"], segs["src_device"], segs["dst_device"],
                            strict=True):
        assert y0 == pytest.approx(layout.row(s) + C.TRANSFER_OFFSET)
        assert y1 == pytest.approx(layout.row(d) + C.TRANSFER_OFFSET)
    # Host transfers get a bar on the destination rows but no segment (no source device).
    bars = C.rectangles(moved, layout, t0=0.0)
    assert "host" in bars["link"] and "host" not in segs["link"]
    assert set(bars["c_link"]) <= set(LINK_COLORS.values())
    assert all(t for t, k in zip(bars["bytes_text"], bars["kind"], strict=True)
               if k == "transfer")
    assert any(bw.endswith("/s") for bw in bars["bw_text"])


def test_select_by_program_and_client(events):
    alice = C.select(events, clients=["alice"])
    assert alice and all(e.client == "alice" and e.program == "local" for e in alice)
    assert {e.program for e in C.select(events, programs=["fig2"])} == {"fig2"}
    assert C.select(events, programs=["nope"]) == []
    assert len(C.select(events)) == len(events)


def test_colours_are_stable_and_colour_blind_safe(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    colors = ColorRegistry()  # not the process-wide one: other tests' programs took colours
    first = C.rectangles(events, layout, 0.0, colors)
    again = C.rectangles(list(reversed(events)), layout, 0.0, colors)
    by_program = dict(zip(first["program"], first["c_program"], strict=True))
    assert by_program == dict(zip(again["program"], again["c_program"], strict=True))
    assert by_program["fig2"] != by_program["local"]
    assert set(OKABE_ITO) <= set(Colorblind8)
    assert set(by_program.values()) <= set(OKABE_ITO)
    assert colors.assigned("program")["fig2"] == by_program["fig2"]
    # the views' default is the process-wide registry, which keeps its colours
    shared = C.rectangles(events, layout, 0.0)
    assert COLORS.assigned("program")["fig2"] == shared["c_program"][shared["program"].index(
        "fig2")]


def test_colour_registry_order_and_wrap():
    reg = ColorRegistry(("#000001", "#000002"))
    assert [reg.color("program", p) for p in "abc"] == ["#000001", "#000002", "#000001"]
    assert reg.color("program", "b") == "#000002"
    assert reg.color("client", "x") == "#000001"  # namespaces are independent
    with pytest.raises(ValueError, match="at least one colour"):
        ColorRegistry(())


def test_tail_is_what_a_rollover_keeps(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    cols = C.rectangles(events, layout, 0.0)
    n = C.length(cols)
    last3 = C.tail(cols, 3)
    assert C.length(last3) == 3
    assert last3["index"] == cols["index"][n - 3:]
    assert C.length(C.tail(cols, 10 * n)) == n


def test_newest_converts_only_what_the_page_keeps(events):
    compute = [e for e in events if e.kind == "compute"]
    picked = C.newest(compute, 3)
    assert picked == compute[-len(picked):]
    assert sum(len(e.devices) for e in picked) >= 3
    assert sum(len(e.devices) for e in picked[1:]) < 3
    assert C.newest(compute, 10_000) == compute


def _spans(events):
    return [(e.t_start, e.t_end, e.devices) for e in events if e.kind == "compute"]


def test_busy_counts_overlaps_once(events):
    base = next(e for e in events if e.kind == "compute")
    d = base.devices[0]
    spans = [base._replace(index=i, t_start=s, t_end=t, devices=(d,))
             for i, (s, t) in enumerate([(0.0, 0.4), (0.2, 0.5), (0.8, 0.9)])]
    layout = C.DeviceLayout(((0, (d, d + 1)),))
    busy = layout.busy(_spans(spans), 0.0, 1.0)
    assert busy[layout.rows[d]] == pytest.approx(0.6)
    assert layout.rows[d + 1] not in busy
    assert layout.busy(_spans(spans), 0.45, 0.85)[layout.rows[d]] == pytest.approx(0.1)


def test_busy_of_a_real_run_is_within_its_window(ctl, events):
    t0 = min(e.t_submit for e in events)
    t1 = max(e.t_end for e in events)
    layout = C.DeviceLayout.from_controller(ctl)
    busy = layout.busy(_spans(events), t0, t1)
    assert all(0.0 <= b <= t1 - t0 for b in busy.values())
    # (an end seen late is stamped as a zero-length span at the instant it is reported: a
    # device that ran only such spans used no measured time)
    ran = {layout.rows[d] for e in events if e.kind == "compute" and e.t_end > e.t_start
           for d in e.devices}
    assert all(busy.get(y, 0.0) > 0 for y in ran)
    assert all(busy[y] == 0 for y in busy if y not in ran)


def test_client_share_and_transfer_summary(events):
    share = C.client_share(events)
    assert set(share) == {"default", "alice"} and all(v > 0 for v in share.values())
    rows = C.transfer_summary(events)
    assert {r["link"] for r in rows} >= {"ici", "dcn", "host"}
    moved = [e for e in events if e.kind == "transfer"]
    assert sum(r["count"] for r in rows) == len(moved)
    assert sum(r["nbytes"] for r in rows) == sum(e.nbytes for e in moved)


def test_layout_rejects_unknown_devices_and_duplicates(ctl):
    layout = C.DeviceLayout.from_controller(ctl)
    with pytest.raises(ValueError, match="device 99 is not in this layout"):
        layout.row(99)
    with pytest.raises(ValueError, match="appears in two islands"):
        C.DeviceLayout.from_islands([(0, (0, 1)), (1, (1, 2))])
    with pytest.raises(ValueError, match="island 7 is not in this layout"):
        layout.island_span(7)


def test_human_units():
    assert C.human_bytes(512) == "512 B"
    assert C.human_bytes(1536) == "1.5 KiB"
    assert C.human_bytes(3 * 1024**3) == "3.0 GiB"
    assert C.human_rate(None) == "" and C.human_rate(2048) == "2.0 KiB/s"


# --- typed columns (encoding): what the live view streams --------------------------------


def _same_rows(encoded: dict, reference: dict, book: E.Codebook) -> None:
    """Decoded typed columns equal the plain columns, row for row (floats to rounding)."""
    decoded = E.decode(encoded, book)
    for k, values in decoded.items():
        if k.startswith("c_") or k == "bandwidth":
            continue
        ref = reference[k]
        if values and isinstance(values[0], float):
            assert values == pytest.approx(ref, abs=1e-12, nan_ok=True), k
        else:
            assert values == ref, k


def test_typed_columns_hold_the_same_rows(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    book, t0 = E.Codebook(), events[0].t_submit
    compute = [e for e in events if e.kind == "compute"]
    moved = [e for e in events if e.kind == "transfer"]
    assert compute and moved
    bars = E.compute_arrays(events, layout, t0, book)  # transfers are skipped
    _same_rows(bars, C.rectangles(compute, layout, t0), book)
    strips = E.transfer_arrays(events, layout, t0, book)
    _same_rows(strips, C.rectangles(moved, layout, t0), book)
    segs = E.link_arrays(events, layout, t0, book)
    ref = C.links(moved, layout, t0)
    _same_rows(segs, ref, book)
    assert {"ici", "dcn"} <= set(book.decode(segs["link"]))
    # Bandwidth stays numeric (NaN when unknown); the page formats it like human_rate.
    rates = [C.human_rate(None if np.isnan(b) else b) for b in segs["bandwidth"]]
    assert rates == ref["bw_text"]


def test_typed_columns_are_numeric_and_match_their_schema(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    book = E.Codebook()
    for build, schema in ((E.compute_arrays, E.COMPUTE_ARRAYS),
                          (E.transfer_arrays, E.TRANSFER_ARRAYS),
                          (E.link_arrays, E.LINK_ARRAYS)):
        for cols in (build(events, layout, 0.0, book), build([], layout, 0.0, book),
                     E.empty_arrays(schema)):
            assert list(cols) == list(schema)
            for k, v in cols.items():
                assert isinstance(v, np.ndarray) and v.dtype == np.dtype(schema[k]), k


def test_colour_indices_give_the_registry_colours(ctl, events):
    layout = C.DeviceLayout.from_controller(ctl)
    failed = next(e for e in events if e.kind == "compute")._replace(status="error")
    evs = [*events, failed]
    bars = E.compute_arrays(evs, layout, 0.0, E.Codebook())
    ref = C.rectangles([e for e in evs if e.kind == "compute"], layout, 0.0)
    palette = COLORS.mapper_palette
    assert [palette[i] for i in bars["c_program"]] == ref["c_program"]
    assert [palette[i] for i in bars["c_client"]] == ref["c_client"]
    assert palette[bars["c_program"][-1]] == FAILED_COLOR  # failed: grey whatever the program


def test_codebook_codes_are_stable_and_links_fixed():
    book = E.Codebook()
    assert book.names[:4] == list(E.LINK_NAMES)
    assert [book.code(n) for n in E.LINK_NAMES] == [0, 1, 2, 3]
    a, b = book.code("train"), book.code("eval")
    assert (a, b, book.code("train")) == (4, 5, 4) and len(book) == 6
    assert book.decode(np.array([5, 4, 1], dtype=np.int32)) == ["eval", "train", "dcn"]
    with pytest.raises(ValueError, match="not in this codebook"):
        book.decode([99])


def test_colour_registry_index():
    reg = ColorRegistry(("#000001", "#000002"))
    assert [reg.index("program", p) for p in "abc"] == [0, 1, 0]
    assert reg.failed_index == 2 and reg.mapper_palette[2] == FAILED_COLOR
    assert reg.color("program", "b") == reg.palette[reg.index("program", "b")]
    assert reg.assigned("program") == {"a": "#000001", "b": "#000002", "c": "#000001"}


def test_unknown_device_in_typed_columns_is_a_clear_error(ctl, events):
    layout = C.DeviceLayout.from_islands([(0, (0, 1))])
    far = next(e for e in events if e.kind == "compute")._replace(devices=(7,))
    with pytest.raises(ValueError, match="device 7 is not in this layout"):
        E.compute_arrays([far], layout, 0.0, E.Codebook())
