"""A cell run again, as a frontend runs it (the same cell id): the live views its previous run
showed left the page with its outputs, and close, unless this run shows them again or a
notebook name still holds them; their threads end with them."""

from __future__ import annotations

from tests.helpers.kernel import run_code

VIEWS = "sum(t.name == 'pwkernel-viz-updater' for t in threading.enumerate())"


def run_cell(kc, code: str, cell_id: str) -> None:
    """Execute ``code`` as the frontend's cell ``cell_id`` (its id in the request's metadata,
    as JupyterLab sends it); fails on an error."""
    msg = kc.session.msg("execute_request", {"code": code, "silent": False,
                                             "store_history": True, "user_expressions": {},
                                             "allow_stdin": False, "stop_on_error": True})
    msg["metadata"]["cellId"] = cell_id
    kc.shell_channel.send(msg)
    while True:
        reply = kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            break
    assert reply["content"]["status"] == "ok", reply["content"]


def test_a_rerun_cell_closes_the_view_it_no_longer_shows(kernel):
    run_cell(kernel, "import threading\nimport pwkernel as pw\nctl = pw.controller()", "setup")
    for _ in range(3):  # Shift+Enter on the same cell, three times
        run_cell(kernel, "view = pw.ScheduleView(ctl, window=1.0)\nview", "view-cell")
    run_cell(kernel, "first = view\nview", "show-cell")  # shown by a second cell, and named
    assert run_code(kernel, f"print({VIEWS})").strip() == "1"
    # the same view shown again by its cell is kept, and so is one a name still holds
    run_cell(kernel, "view", "show-cell")
    run_cell(kernel, "view = pw.ScheduleView(ctl, window=1.0)\nview", "view-cell")
    assert run_code(kernel, f"print({VIEWS}, first.comm is not None)").split() == ["2", "True"]
    run_code(kernel, "first.close(); view.close()")
