"""The standalone report in chromium: a real hover over a computation bar shows its names,
which the page looks up from the integer codes the columns hold (no kernel involved)."""

from __future__ import annotations

from pathlib import Path

import pytest

import pwkernel as pw
from pwkernel.viz.columns import human_bytes, human_rate
from tests.helpers.lab import chromium_page, hover_tooltip, needs_chromium
from tests.helpers.programs import make_programs, run

# Page coordinates of the middle of bar ``row`` of a renderer, through BokehJS's views.
BAR_XY_JS = """([name, row]) => {
  const doc = window.Bokeh.documents[0];
  const renderer = doc.get_model_by_name(name);
  const view = window.Bokeh.index.find_one(renderer);
  const plot = view.parent;
  const src = renderer.data_source;
  const left = src.get_column("left")[row], right = src.get_column("right")[row];
  const sx = plot.frame.x_scale.compute((left + right) / 2);
  const sy = plot.frame.y_scale.compute(src.get_column("y")[row]);
  const box = plot.canvas_view.el.getBoundingClientRect();
  return [box.left + sx, box.top + sy];
}"""


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_report_hover_shows_names(ctl, tmp_path):
    needs_chromium()
    fig2, _ = make_programs(ctl)
    with ctl.client("carol"):
        run(fig2)
    ctl.wait(10.0)
    events = sorted(ctl.trace.events(), key=lambda e: e.index)
    first = next(e for e in events if e.kind == "compute")
    moved = next(e for e in events if e.kind == "transfer" and e.link == "dcn")
    with chromium_page(tmp_path / "profile") as page:
        page.set_default_timeout(60_000)
        # One event per report: its bar spans the whole x axis, easy to hover.
        values = _hover(page, pw.report(ctl, tmp_path / "c.html", events=[first]), "compute")
        # name, program, client (looked up from codes), start, duration, device, status.
        assert values[:3] == [first.name, "fig2", "carol"], values
        assert values[5] == f"{first.devices[0]} (island {first.island})" and values[6] == "ok"
        values = _hover(page, pw.report(ctl, tmp_path / "t.html", events=[moved]), "transfers")
        # ... then link, bytes and bandwidth, formatted in the page like the kernel would.
        assert values[:3] == [moved.name, "fig2", "carol"], values
        assert values[5:9] == ["dcn", human_bytes(moved.nbytes), human_rate(moved.bandwidth),
                               "ok"], values
        # another tenant's computation (a shared pool's): its own hatched bars, tenant first
        other = first._replace(index=first.index + 10_000, program="bob", client="bob/default",
                               tenant="bob")
        values = _hover(page, pw.report(ctl, tmp_path / "o.html", events=[other]), "others")
        assert values[:4] == ["bob", first.name, "bob", "bob/default"], values
        # a computation of no length (it started and ended at once), between two true ones
        # on the same devices: its bar has no width, but its mark in the page is hovered
        at, d = first.t_end + first.duration, first.duration
        instant = first._replace(index=first.index + 20_000, name="instant", t_start=at,
                                 t_end=at)
        later = first._replace(index=first.index + 30_000, t_start=at + d, t_end=at + 2 * d)
        path = pw.report(ctl, tmp_path / "z.html", events=[first, instant, later])
        values = _hover(page, path, "compute", row=len(first.devices))
        assert values[:1] == ["instant"] and values[4:5] == ["0.000000 s"], values
        assert page.errors == [], f"errors in the page: {page.errors}"


def _hover(page, path: Path, renderer: str, row: int = 0) -> list[str]:
    """Open ``path``, hover the middle of ``renderer``'s bar ``row``, return the tooltip."""
    page.goto(path.as_uri())
    page.wait_for_function(f"""() => {{ try {{ return ({BAR_XY_JS})(["{renderer}", {row}])[0] > 0 }}
                               catch (e) {{ return false }} }}""")
    x, y = page.evaluate(BAR_XY_JS, [renderer, row])
    return hover_tooltip(page, x, y)


# (the page makes its document a task after it loads: until then there is none)
DRAWN_JS = """() => {
  const doc = ((window.Bokeh && window.Bokeh.documents) || [])[0];
  if (doc == null) return null;  // not made yet
  const bars = doc.get_model_by_name("compute");
  if (window.Bokeh.index.find_one(bars) == null) return null;  // not drawn yet
  return ["transfers", "ici-links", "dcn-links"].map((n) => doc.get_model_by_name(n).visible);
}"""


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_report_opens_with_transfers_hidden_when_zoomed_out(ctl, tmp_path):
    """The report opens on the whole run: with bars under 2 px wide on average, transfers and
    links are hidden at load; the page decides at its own width once it has laid out."""
    needs_chromium()
    fig2, _ = make_programs(ctl)
    run(fig2)
    ctl.wait(10.0)
    events = sorted(ctl.trace.events(), key=lambda e: e.index)
    one = next(e for e in events if e.kind == "compute")
    top = events[-1].index + 1

    def spread(n):  # n more computations, side by side after the run
        return [one._replace(index=top + i, t_start=one.t_end + i * 1e-4,
                             t_end=one.t_end + i * 1e-4 + 5e-5) for i in range(n)]

    rows = len(ctl.devices)
    # bars per computation: its devices; dense when bars * 2 px > width * rows
    dense = pw.report(ctl, tmp_path / "dense.html", events=events + spread(1000 * rows))
    # dense at the file's assumed 1000 px, not at this page's wider plot
    wider = pw.report(ctl, tmp_path / "wider.html",
                      events=events + spread(int(1050 * rows / 2 / len(one.devices))))
    with chromium_page(tmp_path / "profile", width=1800) as page:
        page.set_default_timeout(60_000)
        for path, visible in ((dense, False), (wider, True)):
            page.goto(path.as_uri())
            page.wait_for_function(f"() => ({DRAWN_JS})() !== null")
            page.wait_for_function(
                f"() => ({DRAWN_JS})().every((v) => v === {str(visible).lower()})")
        assert page.errors == [], f"errors in the page: {page.errors}"
