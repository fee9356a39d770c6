"""%load_ext pwkernel, %pathways and %%pathways in a real IPython InteractiveShell."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from IPython.core.error import UsageError

import pwkernel as pw
from pwkernel.notebook import args as specs
from pwkernel.notebook import comm, extension
from pwkernel.notebook.display import Status
from tests.helpers import ROOT
from tests.helpers.programs import gate
from tests.helpers.shell import run


def test_load_hosts_the_process_controller(ip, capsys):
    ctl = extension.state().ctl
    assert ctl is pw.controller() and [len(i.devices) for i in ctl.islands] == [4, 4]
    ip.run_line_magic("load_ext", "pwkernel")  # twice: harmless, same controller
    assert extension.state().ctl is ctl
    ip.run_line_magic("unload_ext", "pwkernel")
    assert ctl.closed and extension.state() is None
    assert "pathways" not in ip.magics_manager.magics["cell"]
    ip.run_line_magic("load_ext", "pwkernel")
    out = capsys.readouterr().out
    # Loading starts no controller (JAX is left alone until the first %pathways).
    assert "controller closed" in out and "controller starts with the first %pathways" in out
    assert extension.state().peek() is None
    assert comm.status_message(extension.state().peek())["data"]["started"] is False
    status = repr(ip.run_line_magic("pathways", "status"))  # starts it
    assert "cpu" in status and "[0-3]" in status
    assert not extension.state().peek().closed and extension.state().ctl is pw.controller()


def test_sharded_cell_binds_futures_and_keeps_plain_values(ip, capsys):
    run(ip, "%pathways slice s0 2x2 --axes data,model")
    run(ip, "x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")
    last = run(ip, "%%pathways --slice s0\n@jax.jit\ndef f(v):\n    return jnp.sin(v) * 2\n"
                   "y = f(x)\nz = y.sum()\nn = y.shape[0]\ny")
    y, z = ip.user_ns["y"], ip.user_ns["z"]
    assert isinstance(y, pw.Future) and isinstance(z, pw.Future) and last is y
    assert ip.user_ns["n"] == 8 and callable(ip.user_ns["f"])
    np.testing.assert_allclose(np.asarray(y.result()), np.sin(np.arange(16.0).reshape(8, 2)) * 2,
                               rtol=1e-6)
    # The cell ran on s0's four devices, its output sharded over both mesh axes.
    s0 = ip.user_ns["s0"]
    assert {d.id for d in y.sharding.device_set} == set(s0.device_ids)
    assert y.sharding.mesh.shape == {"data": 2, "model": 2}
    events = [e for e in extension.state().ctl.trace.events() if e.program_id == y.run.id]
    assert [e.devices for e in events if e.kind == "compute"] == [s0.device_ids]
    # A later cell reads the futures as inputs.
    run(ip, "%%pathways --slice s0\nw = y + z")
    np.testing.assert_allclose(np.asarray(ip.user_ns["w"].result()),
                               np.asarray(y.result()) + float(z.result()), rtol=1e-6)


@pytest.mark.parametrize("work", ["y = jnp.ones(2) + 1", "y = pw.function(jnp.sin, slice=s0)(x)"],
                         ids=["one-function", "compiled-calls"])
def test_numpy_values_a_cell_makes_stay_the_numpy_values_the_plain_cell_binds(ip, work):
    """NumPy work in a cell is host Python's, as without the magic: its float64 and int64
    values are neither narrowed to JAX's 32 bits (an int64 of 2**40 read back as 0) nor made
    futures, beside the array work that is."""
    run(ip, "%pathways slice s0 2")
    run(ip, "x = np.ones(2, np.float32)")
    run(ip, f"%%pathways --slice s0\n{work}\nbig = np.int64(2**40)\nfine = np.float64(0.1)\n"
            "idx = np.arange(3)\npair = (np.ones(2), y)")
    ns = ip.user_ns
    assert isinstance(ns["y"], pw.Future) and isinstance(ns["pair"][1], pw.Future)
    for name, want in [("big", np.int64(1099511627776)), ("fine", np.float64(0.1)),
                       ("idx", np.array([0, 1, 2], np.int64)), ("pair", np.ones(2, np.float64))]:
        got = ns[name][0] if name == "pair" else ns[name]
        assert type(got) is type(want) and got.dtype == want.dtype, (name, type(got))
        np.testing.assert_array_equal(got, want)


def test_a_typed_key_flows_from_cell_to_cell(ip):
    """A jax.random.key carried between %%pathways cells, as a training loop does, draws
    what plain JAX draws (before, a typed key was captured as a constant)."""
    run(ip, "%pathways slice s0 2")
    run(ip, "key = jax.random.key(0)")
    for name in ("x", "y"):
        run(ip, f"%%pathways --slice s0\nkey, sub = jax.random.split(key)\n"
                f"{name} = jax.random.normal(sub, (4,))")
    key, want = ip.user_ns["key"], jax.random.key(0)
    assert isinstance(key, pw.Future) and key.dtype == want.dtype
    for name in ("x", "y"):
        want, sub = jax.random.split(want)
        np.testing.assert_array_equal(np.asarray(ip.user_ns[name].result()),
                                      np.asarray(jax.random.normal(sub, (4,))))
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(key.result())),
                                  np.asarray(jax.random.key_data(want)))


def test_the_ambient_mesh_is_the_cell_slice(ip):
    run(ip, "%pathways slice s0 4 --axes data --axis-types auto")
    run(ip, "from jax.sharding import PartitionSpec as P\nx = np.ones((8, 4), np.float32)")
    run(ip, "%%pathways --slice s0\nmesh_axes = jax.sharding.get_abstract_mesh().axis_names\n"
            "y = jax.lax.with_sharding_constraint(x * 3, P(None, 'data'))")
    assert ip.user_ns["mesh_axes"] == ("data",)
    assert float(ip.user_ns["y"].result().sum()) == 96.0
    # The constraint decides the output's layout (JAX's propagation), not a default rule.
    assert ip.user_ns["y"].sharding.spec == ip.user_ns["P"](None, "data")
    with pytest.raises(UsageError, match="must be explicit or auto"):
        run(ip, "%pathways slice s1 4 --axis-types manual")
    # a flag that does not fit the shape: the fix is written as the magic's flags
    with pytest.raises(UsageError, match=r"--axes data must name each of the 2 dimensions "
                                         r".*Maybe you want %pathways slice s1 2x2 --axes x,y"):
        run(ip, "%pathways slice s1 2,2 --axes data")
    with pytest.raises(UsageError, match=r"--axes a,a must name.*--axes x,y\.$"):
        run(ip, "%pathways slice s1 2x2 --axes a,a")
    with pytest.raises(UsageError, match=r"3 types for the 2 dimensions.*--axis-types auto\.$"):
        run(ip, "%pathways slice s1 2x2 --axis-types auto,auto,explicit")


def test_program_cell_makes_one_node_per_call(ip):
    run(ip, "%pathways slice s0 2\n")
    run(ip, "%pathways slice s1 2 --island 1")
    run(ip, "a = pw.function(lambda v: v * 2, slice=s0)\nb = pw.function(lambda v: v + 1, "
            "slice=s1)\nx = np.array([1.0, 2.0], np.float32)")
    run(ip, "%%pathways --viz\nu = a(x)\nv = b(u)\nlabel = 'two nodes'")
    v = ip.user_ns["v"]
    assert v.result().tolist() == [3.0, 5.0] and ip.user_ns["label"] == "two nodes"
    ctl = extension.state().ctl
    events = [e for e in ctl.trace.events() if e.program_id == v.run.id]
    assert sorted(e.island for e in events if e.kind == "compute") == [0, 1]
    assert ip.user_ns["u"].run is v.run  # one program, submitted at once



def test_a_cell_or_segment_whose_only_work_is_jax_debug_print_prints(ip, capsys):
    """A program with effects and no values (``jax.debug.print`` alone, the cell's last
    segment after a ``print``, or a compiled function that only prints) runs, as plain
    Python, and prints; before, it was never submitted: nothing printed, and a whole cell
    said it had no array work."""
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nx = jnp.arange(3.0)")
    capsys.readouterr()
    run(ip, "%%pathways --slice s\njax.debug.print('alone {}', x)")
    out = capsys.readouterr().out
    assert "alone [0. 1. 2.]" in out and "no array work" not in out, out
    run(ip, "%%pathways --slice s\ny = x + 1\nprint(float(y.sum()))\njax.debug.print('last {}', y)")
    assert "6.0\nlast [1. 2. 3.]" in capsys.readouterr().out
    run(ip, "show = pw.function(lambda v: jax.debug.print('fn {}', v), slice=s)")
    run(ip, "%%pathways --slice s\nshow(x)")
    assert "fn [0. 1. 2.]" in capsys.readouterr().out

def test_viz_prints_what_ran_where(ip, capsys):
    run(ip, "x = np.ones(8, np.float32)")
    capsys.readouterr()
    run(ip, "%%pathways --devices 2 --island 1 --viz\ny = x + 1")
    out = capsys.readouterr().out
    assert "1 computation" in out and "island 1 devices [4, 5]" in out
    # The --devices slice is given back once the cell's program ended.
    assert extension.state().temporary == [] and extension.state().ctl.slices == ()


def test_no_block_returns_futures_and_client_flags(ip):
    run(ip, "%pathways client alice --weight 2 --priority 1")
    run(ip, "x = np.ones(8, np.float32)")
    run(ip, "%%pathways --no-block --client bob --priority 5\ny = x * 4")
    y = ip.user_ns["y"]
    assert isinstance(y, pw.Future) and y.run.client == "bob"
    assert y.result(timeout=60).tolist() == [4.0] * 8
    run(ip, "%%pathways\nz = x * 5")
    assert ip.user_ns["z"].run.client == "alice"
    assert ip.user_ns["z"].run.client_spec.weight == 2.0


def test_timeout_cancels_the_rest_and_the_shell_stays_usable(ip):
    run(ip, "%pathways slice s0 2")
    run(ip, "def heavy(v):\n    m = jnp.eye(128, dtype=v.dtype)\n"
            "    return jax.lax.fori_loop(0, 50, lambda i, a: jnp.tanh(a @ m), v)\n"
            "h = pw.function(heavy, slice=s0)\nx = np.ones((128, 128), np.float32)")
    # sequential: each step is launched once the one before it ended, so the timeout always
    # finds most of them queued; in parallel dispatch the whole chain may be launched into
    # XLA before it expires (the timer's thread starved on a loaded machine), and launched
    # work cannot be recalled, only waited for
    with pytest.raises(TimeoutError, match="--timeout"):
        run(ip, "%%pathways --sequential --timeout 0.001\ny = x\nfor _ in range(300):\n"
                "    y = h(y)")
    ctl = extension.state().ctl
    assert ctl.wait(timeout=60) and ctl.runs() == []
    assert "y" not in ip.user_ns or not isinstance(ip.user_ns["y"], pw.Future)
    events = [e for e in ctl.trace.events() if e.name == "heavy"]
    assert len(events) < 300  # the queued rest was cancelled, not run
    run(ip, "%%pathways --slice s0\nok = x[0] + 1")
    assert ip.user_ns["ok"].result().shape == (128,)


@pytest.mark.parametrize("cell, fix", [
    ("%%pathways --slice nope\ny = 1", "%pathways slice nope"),
    ("%%pathways --slice s0 --devices 2\ny = 1", "not allowed with argument --slice"),
    ("%%pathways --devices 9\ny = 1", "does not fit"),
    ("%%pathways --island 1\ny = 1", "without --devices the cell runs on all devices of "
     "island 0. Add --devices N (e.g. %%pathways --devices 2 --island 1), or drop --island."),
    ("%%pathways --slice s0 --island 1\ny = 1", "--slice s0 already fixes its island. "
     "Drop --island"),
    ("%%pathways --bogus\ny = 1", "unrecognized arguments: --bogus"),
    ("%%pathways --timeout -1\ny = 1", "positive number"),
    ("%%pathways\ny = (1\n", "syntax error in the cell at line 2"),
    ("%%pathways\n", "body is empty"),
    ("%%pathways\n\n   \n", "the cell is empty"),
    ("%pathways slice t 0x2", "positive ints"),
    ("%pathways slice t 2x", "'2x' is not a list of positive ints"),
    ("%pathways slice t x2", "'x2' is not a list of positive ints"),
    ("%pathways slice t 2xx2", "'2xx2' is not a list of positive ints"),
    ("%pathways slice t ,2", "',2' is not a list of positive ints"),
    ("%pathways slice t 2,x2", "'2,x2' is not a list of positive ints"),
    ("%pathways attach local --islands 4,,4", "'4,,4' is not a list of positive ints"),
    ("%%pathways --timeout inf\ny = 1", "leave --timeout out to wait without a limit"),
    ("%%pathways --timeout 1e10\ny = 1", "up to 31536000 (a year)"),
    ("%%pathways --timeout nan\ny = 1", "positive number of seconds"),
    ("%%pathways --weight inf\ny = 1", "positive number up to 1e6"),
    ("%pathways client ''", "a client name is 1 to 100 characters"),
    ("%pathways client '  '", "a client name is 1 to 100 characters"),
    ("%%pathways --client ''\ny = 1", "a client name is 1 to 100 characters"),
    ("%pathways slice t 8", "does not fit"),
    ("%pathways slice t 2 --island 7", "island 7 does not exist"),
    ("%pathways release nothing", "is not a slice"),
    ("%pathways policy lifo", "invalid choice"),
    ("%pathways dispatch fast", "invalid choice"),
    ("%pathways trace save", "needs a PATH"),
    ("%pathways trace save .json", "the path names no file"),
    ("%pathways frobnicate", "invalid choice"),
    ("%pathways slice for 2", "'for' is not a name a variable can have"),
    ("%pathways slice s2 2 --axis x", "unrecognized arguments: --axis x. Did you mean --axes?"),
    ("%%pathways --noblock\ny = 1", "Did you mean --no-block?"),
    ("%%pathways --timout 5\ny = 1", "Did you mean --timeout?"),
    # a missing argument: the subcommand's usage, with the values it takes
    ("%pathways policy", "required: policy. Usage: %pathways policy {fifo,priority,share}."),
    ("%pathways dispatch", "Usage: %pathways dispatch {parallel,sequential}."),
    ("%pathways trace", "Usage: %pathways trace [--rows auto|device|host|island] {save,clear}"),
    ("%pathways attach", "{ray,local,sim}."),
    ("%pathways slice t", "required: SHAPE. Usage: %pathways slice [--island I]"),
])
def test_bad_input_is_a_short_usage_error(ip, cell, fix):
    run(ip, "%pathways slice s0 2")
    with pytest.raises(UsageError, match=re.escape(fix)):
        run(ip, cell)
    assert extension.state().ctl.runs() == []


@pytest.mark.parametrize("line, says, never", [
    ("%pathways policy fifo --weight 2",
     "--weight goes with %pathways client and %pathways attach, not with %pathways policy.",
     "Did you mean --weight"),
    ("%pathways slice s1 2 --priority 3",
     "--priority goes with %pathways client, not with %pathways slice.", "Did you mean"),
    ("%pathways status --verbose", "unrecognized arguments: --verbose.", "Did you mean"),
    ("%pathways client bob --wieght 2", "Did you mean --weight?", "goes with"),
    ("%pathways -h", "%pathways takes no -h: its help is %pathways?", "required"),
    ("%pathways slice --help", "%pathways takes no --help: its help is %pathways?",
     "required"),
    ("%%pathways --slice s0 -h\ny = 1", "%%pathways takes no -h: its help is %%pathways?",
     "unrecognized"),
])
def test_misplaced_flags_and_help_requests_name_the_fix(ip, line, says, never):
    run(ip, "%pathways slice s0 2")
    with pytest.raises(UsageError) as err:
        run(ip, line)
    assert says in str(err.value) and never not in str(err.value), str(err.value)


def test_a_comment_after_the_magic_is_a_comment(ip, tmp_path):
    """``#`` starting a word outside quotes ends the arguments, as in Python and a shell."""
    run(ip, "%pathways slice s9 2 --axes data  # the data-parallel slice")
    assert ip.user_ns["s9"].axis_names == ("data",)
    run(ip, "x = np.ones(4, np.float32)")
    run(ip, "%%pathways --slice s9 --timeout 60  # one step\ny = x + 1")
    assert ip.user_ns["y"].result().tolist() == [2.0] * 4
    run(ip, f"%pathways trace save {tmp_path / 'run#1.json'} #no space needed after it")
    run(ip, f"%pathways trace save '{tmp_path / '# quoted.json'}'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["# quoted.json", "run#1.json"]
    with pytest.raises(UsageError, match="required: NAME, SHAPE"):
        run(ip, "%pathways slice # s10 2")


def test_slice_errors_list_only_usable_slices_and_say_what_a_name_holds(ip):
    run(ip, "%pathways slice s0 2\n")
    run(ip, "%pathways slice s1 2")
    run(ip, "s1.release()\nf = 3")
    with pytest.raises(UsageError) as err:
        run(ip, "%%pathways --slice f\ny = 1")
    assert "no slice named 'f' (f is of type int) (slices: s0)." in str(err.value), err.value
    with pytest.raises(UsageError) as err:
        run(ip, "%%pathways --slice s2\ny = 1")
    assert "no slice named 's2' (slices: s0)." in str(err.value)  # not s1: released


def test_a_refused_client_name_leaves_later_cells_working(ip):
    run(ip, "x = np.ones(4, np.float32)")
    with pytest.raises(UsageError):
        run(ip, "%pathways client ''")
    run(ip, "%%pathways\ny = x + 1")
    assert ip.user_ns["y"].result().tolist() == [2.0] * 4


@pytest.mark.parametrize("body, names", [
    ("z = 1", {"z": 1}),
    ("import math\nr = math.sqrt(16)", {"r": 4.0}),
    ("t = (1, 'a')\nu = len(t)", {"t": (1, "a"), "u": 2}),
    ("print('hello')\nn = None", {"n": None}),
])
def test_a_cell_without_array_work_runs_as_plain_python(ip, capsys, body, names):
    run(ip, "x = np.ones(4, np.float32)")
    capsys.readouterr()
    run(ip, f"%%pathways --devices 1\n{body}")
    assert {k: ip.user_ns[k] for k in names} == names
    assert "no array work in this cell; it ran as plain Python" in capsys.readouterr().out
    ctl = extension.state().ctl
    assert ctl.runs() == [] and ctl.slices == ()  # no program; the --devices slice given back
    assert run(ip, "%%pathways\n2 + 3") == 5


def test_timeout_limits_a_cell_that_runs_as_plain_python(ip):
    """``y = f(x)`` then ``l = y.sum()`` runs as plain Python (it reads ``y``'s value): its
    wait for the value ends at ``--timeout`` with ``CellTimeout``, as a program's does, at the
    line that waited; what it bound stays bound, as plain Python leaves it. Before, the wait
    had no limit (the cell hung as long as the value took)."""
    run(ip, "%pathways slice s 2")
    entered, release = threading.Event(), threading.Event()
    s = ip.user_ns["s"]
    run(ip, "x = np.ones(2, np.float32)")
    ip.user_ns["held"] = pw.function(gate(entered, release, s.mesh), slice=s,
                                     in_specs=pw.BATCH)(np.ones(2, np.float32))
    assert entered.wait(60)  # s is busy: f(x) queues behind it
    run(ip, "f = pw.function(lambda v: v * 2, slice=s)")
    try:
        with pytest.raises(TimeoutError, match="did not end within --timeout 0.2 s: its "
                                               "Python, run as plain Python") as info:
            run(ip, "%%pathways --slice s --timeout 0.2\ny = f(x)\nl = y.sum()\n")
        assert isinstance(info.value, pw.PathwaysError), type(info.value)  # CellTimeout
    finally:
        release.set()
    assert "l" not in ip.user_ns
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), [2.0, 2.0])  # bound, as plain
    run(ip, "%%pathways --slice s --timeout 60\ny = f(x)\nl = y.sum()\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["l"]), 4.0)


def test_no_block_timeout_cancels_and_says_so(ip):
    """--timeout with --no-block: the program is cancelled when the time is up, the cell's
    display says so, and the queued rest never runs."""
    run(ip, "import threading\ngate = threading.Event()\n"
            "def hold(v):\n    gate.wait(300)\n    return v\n"
            "step = pw.function(lambda v: jax.pure_callback(hold, jax.ShapeDtypeStruct(v.shape, "
            "v.dtype), v), slice=pw.controller().slice(1, island=0))\n"
            "x = np.ones(4, np.float32)")
    run(ip, "%%pathways --no-block --timeout 0.2\ny = step(x)\nfor _ in range(5):\n"
            "    y = step(y)")
    y = ip.user_ns["y"]
    ctl = extension.state().ctl
    try:
        with pytest.raises(pw.CancelledError, match="timed out after --timeout 0.2 s"):
            y.result(timeout=60)  # fails once the timer cancelled the queued steps
    finally:
        ip.user_ns["gate"].set()
    assert y.run.wait(60)
    (display,) = extension.state().live  # what the cell shows, updated when the run ended
    assert repr(display).startswith("[cell[") and repr(display).endswith(
        ": cancelled (--timeout 0.2 s expired)]"), repr(display)
    assert len([e for e in ctl.trace.events() if e.program_id == y.run.id
                and e.kind == "compute"]) == 1  # the held step; the five queued never ran
    assert not [t for t in threading.enumerate() if t.name.startswith("pwkernel-timeout")]


def test_a_cancelled_cell_ends_while_a_launched_computation_still_runs(ip):
    """A cancel (the sidebar's, here through the comm) ends a blocking cell at once with the
    cancel error: its output failed. The computation already running finishes afterwards."""
    run(ip, "import threading\ngate, entered = threading.Event(), threading.Event()\n"
            "def hold(v):\n    entered.set()\n    gate.wait(300)\n    return v\n"
            "step = pw.function(lambda v: jax.pure_callback(hold, jax.ShapeDtypeStruct(v.shape, "
            "v.dtype), v), slice=pw.controller().slice(1, island=0))\n"
            "x = np.ones(4, np.float32)")
    ns, ctl = ip.user_ns, extension.state().ctl
    cell_ended, seen = threading.Event(), []

    def cancel_from_the_sidebar() -> None:
        assert ns["entered"].wait(60)
        (run_,) = ctl.runs()
        seen.append(comm.reply(ctl, {"type": "cancel", "run": run_.id}))
        seen.append(cell_ended.wait(60))  # True: the cell ended while the first step held
        ns["gate"].set()

    canceller = threading.Thread(target=cancel_from_the_sidebar)
    canceller.start()
    try:
        with pytest.raises(pw.CancelledError, match="cancelled from the Pathways sidebar"):
            run(ip, "%%pathways\ny = step(x)\nfor _ in range(5):\n    y = step(y)")
    finally:
        cell_ended.set()
        canceller.join(60)
    assert seen[0]["cancelled"] == 5 and seen[1] is True
    assert ctl.wait(60) and ctl.runs() == []


def test_user_errors_point_at_the_cell_line(ip, capsys):
    run(ip, "x = np.ones(4, np.float32)")
    result = ip.run_cell("%%pathways\ny = x + 1\nz = y + undefined_name\n")
    assert isinstance(result.error_in_exec, NameError)
    frames = []
    tb = result.error_in_exec.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    # It ends at line 3 of the cell; no frame of the runtime or of JAX in between.
    inside = (os.path.join("", "pwkernel", "runtime", ""), os.path.join("", "jax", ""))
    assert frames[-1][1] == 3 and not any(p in f for f, _ in frames for p in inside)
    assert extension.state().ctl.runs() == []


def test_an_undefined_last_expression_shows_no_frames_of_pwkernel(ip, capsys):
    """A cell whose last line is an undefined name raises ``NameError`` as Python does, and
    its traceback points at that line with no frame of pwkernel's; a builtin's name there is
    the builtin, as in Python."""
    capsys.readouterr()
    for body in ("q = jnp.ones(3)\nundefined_name", "z = 1\nundefined_name"):
        result = ip.run_cell("%%pathways\n" + body)
        assert isinstance(result.error_in_exec, NameError)
        shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # (no colours)
        assert "----> 3 undefined_name" in shown and "pwkernel" not in shown, shown
    assert run(ip, "%%pathways\nq = jnp.ones(3)\nlen") is len  # a builtin, as in Python


def test_a_failed_computation_shows_the_users_frames_not_an_earlier_raise(ip):
    """A cell whose program failed raises the error with the user's frames only (here the
    callback's line, no runtime or JAX frames), and a cell that reads that failed value later
    does not show the frames of an earlier statement that raised it (``print(w)``)."""
    run(ip, "def bad(v):\n    raise ValueError(f'bad value {v}')\n")
    run(ip, "%pathways slice s 2")

    def frames(error) -> list[tuple[str, str]]:
        out, tb = [], error.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            out.append((code.co_filename, code.co_name))
            tb = tb.tb_next
        return out

    inside = (os.path.join("", "pwkernel", "runtime", ""), os.path.join("", "jax", ""))
    for no_block in (False, True):
        cell = ("%%pathways --slice s" + " --no-block" * no_block
                + "\nw = jnp.ones(2)\njax.debug.callback(bad, w.sum())\nz = w * 2\n")
        result = ip.run_cell(cell)
        if not no_block:
            assert isinstance(result.error_in_exec, ValueError)
            assert not any(p in f for f, _ in frames(result.error_in_exec) for p in inside)
            assert frames(result.error_in_exec)[-1][1] == "bad"
    ip.user_ns["w"].exception(60)
    with pytest.raises(ValueError, match="bad value 2.0"):
        run(ip, "print(w)")
    result = ip.run_cell("%%pathways --slice s\nq = w + 1\n")
    assert isinstance(result.error_in_exec, ValueError), result.error_in_exec
    assert "__str__" not in [name for _, name in frames(result.error_in_exec)]
    assert not any(p in f for f, _ in frames(result.error_in_exec) for p in inside)


def test_status_and_rich_displays(ip):
    run(ip, "%pathways slice s0 2x2")
    run(ip, "other = pw.controller().slice(2, island=1, axis_types='auto')")  # not a magic's
    run(ip, "x = jax.device_put(np.ones(8, np.float32), jax.NamedSharding(s0.mesh, jax.P('x')))")
    run(ip, "%%pathways --slice s0\ny = x * 2")
    status = run(ip, "%pathways status")
    assert isinstance(status, Status)
    text, page = repr(status), status._repr_html_()
    for part in ("island", "s0", "x=2 x y=2", "Memory per device", "policy fifo", "explicit",
                 "other", "auto"):
        assert part in text and part in page
    fmt = ip.display_formatter
    data, _ = fmt.format(ip.user_ns["y"])
    assert "float32[8]" in data["text/plain"] and "done" in data["text/plain"]
    assert "<table" in data["text/html"] and "island 0 devices [0-3]" in data["text/html"]
    # The layout picture: y kept x's P('x') on a 2x2 mesh: 2 blocks, each on 2 devices.
    assert "2 blocks of 4, each on 2 devices" in data["text/html"]
    assert "[0:4] on i0:d0 i0:d1" in data["text/html"]
    data, _ = fmt.format(ip.user_ns["y"].result())  # a jax.Array on the slice: pictured too
    assert "2 blocks of 4" in data["text/html"] and "[4:8] on i0:d2 i0:d3" in data["text/html"]
    data, _ = fmt.format(jax_on_two_islands(ip))  # not on one island: JAX's own display
    assert "text/html" not in data
    data, _ = fmt.format(ip.user_ns["s0"])
    assert "x=2 x y=2" in data["text/plain"] and "<table" in data["text/html"]
    data, _ = fmt.format(extension.state().ctl)
    assert "[4-7]" in data["text/plain"] and "<table" in data["text/html"]


def jax_on_two_islands(ip):
    ctl = extension.state().ctl
    devices = [ctl.islands[0].devices[0], ctl.islands[1].devices[0]]
    mesh = ip.user_ns["jax"].make_mesh((2,), ("x",), devices=devices)
    return ip.user_ns["jax"].device_put(np.ones(4), ip.user_ns["jax"].NamedSharding(
        mesh, ip.user_ns["jax"].P("x")))


def test_policy_dispatch_trace_release_reset(ip, tmp_path, capsys):
    run(ip, "%pathways policy share")
    run(ip, "%pathways dispatch sequential")
    ctl = extension.state().ctl
    assert (ctl.policy, ctl.dispatch) == ("share", "sequential")
    run(ip, "%pathways dispatch parallel")
    run(ip, "x = np.ones(8, np.float32)")
    run(ip, "%%pathways --sequential\ny = x * 2")
    assert ctl.dispatch == "parallel" and ip.user_ns["y"].result()[0] == 2.0
    run(ip, f"%pathways trace save {tmp_path / 't.json'}")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    run(ip, "%pathways trace clear")
    assert len(ctl.trace) == 0
    run(ip, "%pathways slice s0 2")
    run(ip, "%pathways slice s1 2")
    s0 = ip.user_ns["s0"]
    run(ip, "%pathways release s0")
    assert s0.released and "s0" not in ip.user_ns
    run(ip, "%pathways reset")
    assert "s1" not in ip.user_ns and "released 1 slices (s1)" in capsys.readouterr().out
    # a name rebound since the slice was made keeps its new value
    run(ip, "%pathways slice s0 2")
    run(ip, "%pathways slice s1 2")
    run(ip, "s0 = 'my data'\ns1 = 42")
    run(ip, "%pathways release s0")
    run(ip, "%pathways reset")
    assert ip.user_ns["s0"] == "my data" and ip.user_ns["s1"] == 42
    assert "released 1 slices (s1)" in capsys.readouterr().out


def test_running_a_slice_line_again_keeps_its_devices(ip):
    """The old slice was given back only after the new one was placed, so each run of the
    same line moved the name to the other island; a line that fails keeps the old slice."""
    run(ip, "%pathways slice s0 2")
    first = ip.user_ns["s0"]
    ids = first.device_ids
    for _ in range(2):
        run(ip, "%pathways slice s0 2")
        now = ip.user_ns["s0"]
        assert first.released and now.device_ids == ids and not now.released
        first = now
    with pytest.raises(UsageError, match="does not fit"):
        ip.run_line_magic("pathways", "slice s0 8")
    assert ip.user_ns["s0"] is now and not now.released
    assert extension.state().ctl.slice(2).device_ids == (4, 5)  # s0's load still counts


def test_a_slice_on_the_devices_named_by_id(ip):
    """``%pathways slice NAME SHAPE --devices 7,6`` places it as ``ctl.slice(..., devices=)``
    does, in mesh order; a wrong count, and devices off one island, name the flags to use."""
    run(ip, "%pathways slice s 2x2 --devices 7,6,5,4 --axes a,b")
    vs = ip.user_ns["s"]
    assert vs.device_ids == (7, 6, 5, 4) and vs.island.id == 1 and vs.axis_names == ("a", "b")
    run(ip, "%%pathways --slice s\ny = jnp.ones(4) * 2")
    assert {d.id for d in ip.user_ns["y"].sharding.device_set} == {4, 5, 6, 7}
    with pytest.raises(UsageError, match=re.escape(
            "--devices 2 must list 2 distinct device ids for shape 2, one per device, in "
            "mesh order. Maybe you want %pathways slice t 2 --devices 0,1.")):
        run(ip, "%pathways slice t 2 --devices 2")
    with pytest.raises(UsageError, match=re.escape(
            "devices [4, 5] are not all on island 0; a slice lives on one island, and the "
            "islands here are 0: [0, 1, 2, 3], 1: [4, 5, 6, 7]. Maybe you want --devices 0,1 "
            "--island 0.")):
        run(ip, "%pathways slice t 2 --devices 4,5 --island 0")
    with pytest.raises(UsageError, match="--devices goes with %pathways slice"):
        run(ip, "%pathways status --devices 1")
    # a slice too large: the fix is the magic's own line (it said ctl.slice(4))
    with pytest.raises(UsageError, match=re.escape(
            "maybe you want %pathways slice t 4, or a controller")):
        run(ip, "%pathways slice t 100")
    with pytest.raises(UsageError, match=re.escape(
            "Maybe you want %pathways slice t 4 --island 1, or a controller")):
        run(ip, "%pathways slice t 6 --island 1")
    assert ip.user_ns["s"] is vs and not vs.released


def test_trace_save_rows_picks_the_tracks(ip, tmp_path):
    """``--rows`` goes to ``trace.save``: a track per island holds all its devices' spans."""
    run(ip, "x = np.ones(8, np.float32)")
    run(ip, "%%pathways --devices 4\ny = x * 2")
    ip.user_ns["y"].result()

    def tracks(name: str) -> set[str]:
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        return {e["args"]["name"] for e in events if e.get("name") == "thread_name"
                and "transfers" not in e["args"]["name"]}

    run(ip, f"%pathways trace save {tmp_path / 'devices.json'}")
    run(ip, f"%pathways trace save --rows island {tmp_path / 'islands.json'}")
    run(ip, f"%pathways trace save {tmp_path / 'hosts.json'} --rows host")
    ran = sorted(d for e in extension.state().ctl.trace.events() for d in e.devices)
    assert tracks("devices.json") == {f"device {d}" for d in ran}  # 8 devices fit: auto
    assert tracks("islands.json") == {"all (4 devices)"}
    assert tracks("hosts.json") == {f"host {d} (1 device)" for d in ran}  # a host per device
    for bad, fix in [("--rows chip", "choose from 'auto', 'device', 'host', 'island'"),
                     ("--rows", "--rows: expected one argument")]:
        with pytest.raises(UsageError, match=re.escape(fix)):
            run(ip, f"%pathways trace save {tmp_path / 'bad.json'} {bad}")
    with pytest.raises(UsageError, match="trace clear takes no arguments"):
        run(ip, "%pathways trace clear --rows host")
    assert not (tmp_path / "bad.json").exists() and len(extension.state().ctl.trace) > 0


def test_trace_save_expands_the_home_folder_and_says_why_it_cannot_write(ip, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    run(ip, "%pathways trace save ~/home.json")
    assert json.loads((tmp_path / "home.json").read_text())["traceEvents"] is not None
    missing = tmp_path / "no" / "t.json"
    with pytest.raises(UsageError, match=re.escape(
            f"cannot write {str(missing)!r} (No such file or directory). Pass a path in a "
            "folder that exists")):
        run(ip, f"%pathways trace save {missing}")


def test_help_comes_from_the_shared_specs(ip):
    doc = ip.magics_manager.magics["line"]["pathways"].__doc__
    for word in ("status", "slice", "release", "policy", "dispatch", "client", "trace", "reset"):
        assert word in doc
    cell_doc = ip.magics_manager.magics["cell"]["pathways"].__doc__
    for flag in ("--slice", "--devices", "--island", "--client", "--weight", "--priority",
                 "--sequential", "--no-block", "--timeout", "--viz"):
        assert flag in cell_doc
    assert specs.parse_line("").command == "status"


def test_help_explains_every_flag_and_the_docs_list_them(ip):
    """``%pathways?`` says what each subcommand's flags mean (the parsers' own help), and
    docs/magics.md names every subcommand and flag the parsers take."""
    doc = ip.magics_manager.magics["line"]["pathways"].__doc__
    for name, sub in specs.LINE.subcommands.items():
        for flag, text in sub.option_help().items():
            assert text, f"%pathways {name} {flag}: no help"
            assert " ".join(text.split()[:4]) in " ".join(doc.split()), (name, flag)
    docs = (ROOT / "docs" / "magics.md").read_text()
    line_table = docs.split("## `%pathways SUBCOMMAND`")[1].split("## `%%pathways")[0]
    cell_table = docs.split("| flag | example | meaning |")[1]
    for name, sub in specs.LINE.subcommands.items():
        row = next((r for r in line_table.splitlines() if r.startswith(f"| `{name}")), None)
        assert row is not None, f"docs/magics.md has no row for %pathways {name}"
        for flag in sub.flags():
            assert flag in row, f"docs/magics.md: %pathways {name} row lacks {flag}"
    for flag in specs.CELL.flags():
        assert f"`{flag}" in cell_table, f"docs/magics.md: the %%pathways table lacks {flag}"


def test_comm_protocol_replies():
    ctl = pw.controller()
    assert comm.reply(ctl, {"type": "status"})["data"]["policy"] == ctl.policy
    json.dumps(comm.reply(ctl, {"type": "status"}))
    assert comm.reply(ctl, {"type": "nope"})["type"] == "error"
    assert "'type'" in comm.reply(ctl, [1, 2])["error"]


def test_comm_lists_every_slice_with_axis_types(ip):
    run(ip, "%pathways slice s0 2x2 --axes data,model")
    run(ip, "mine = pw.controller().slice(2, island=1, axis_types='auto')\n"
            "pw.controller().slice(1, island=1)")  # held by nothing but the controller
    ctl = extension.state().ctl
    slices = {s["name"]: s for s in comm.status_message(ctl)["data"]["named_slices"]}
    assert slices["s0"]["axis_names"] == ["data", "model"]
    assert slices["s0"]["axis_types"] == ["explicit", "explicit"]
    assert slices["mine"]["axis_types"] == ["auto"] and slices["mine"]["island"] == 1
    anonymous = [n for n in slices if n.startswith("#")]
    assert len(slices) == len(ctl.slices) == 3 and len(anonymous) == 1
    assert comm.reply(None, {"type": "policy", "policy": "fifo"})["error"].startswith(
        "the controller has not started yet")


def test_attach_local_as_the_first_magic_starts_the_controller(ip, capsys, monkeypatch):
    """``%pathways attach local`` before any other %pathways: no controller to replace, so its
    islands come from PWKERNEL_ISLANDS (issue 24: this raised AttributeError)."""
    from pwkernel.runtime.controller import running_default

    if (other := running_default()) is not None:  # a fresh kernel has none
        other.close()
    assert extension.state().peek() is None
    monkeypatch.setenv("PWKERNEL_ISLANDS", "2,2")
    run(ip, "%pathways attach local")
    ctl = extension.state().ctl
    assert ctl is pw.controller() and ctl.backend == "local" and not ctl.closed
    assert [len(i.devices) for i in ctl.islands] == [2, 2]
    assert "attached local: island 0: 2 cpu, island 1: 2 cpu" in capsys.readouterr().out


def test_attach_sim_runs_cells_on_a_simulated_pod(ip, capsys, monkeypatch):
    run(ip, "%pathways attach sim --preset tpu-v4 --islands 1024,1024")
    ctl = extension.state().ctl
    assert ctl.backend == "sim" and [len(i.devices) for i in ctl.islands] == [1024, 1024]
    assert "island 1: 1024 sim" in capsys.readouterr().out
    run(ip, "x = np.ones((8192, 512), np.float32)\nw = np.ones((512, 512), np.float32)")
    run(ip, "%%pathways --devices 256\ny = jnp.tanh(x @ w)\ntotal = y.sum()")
    y = ip.user_ns["y"]
    assert y.done() and y.shape == (8192, 512) and len(y.sharding.device_set) == 256
    assert ctl.executor.now() > 0  # the cell waited: the virtual clock moved
    shown = run(ip, "y")
    fmt = ip.display_formatter.formatters["text/plain"]
    assert "simulated: shape and times only" in fmt(shown)
    with pytest.raises(pw.NoValueError, match="simulated controller"):
        run(ip, "total.result()")
    status = repr(ip.run_line_magic("pathways", "status"))
    assert "[0-255]" in status and status.count("\n") < 40  # memory rows grouped, not 2048
    with pytest.raises(UsageError, match="takes no --preset"):
        run(ip, "%pathways attach local --preset tpu-v4")
    with pytest.raises(UsageError, match="islands of a TPU preset are equal"):
        run(ip, "%pathways attach sim --islands 1024,512")
    monkeypatch.setenv("PWKERNEL_ISLANDS", "4,4")
    run(ip, "%pathways attach local")  # this machine's devices again, not the pod's chips
    ctl = extension.state().ctl
    assert ctl.backend == "local" and [len(i.devices) for i in ctl.islands] == [4, 4]



def test_attach_says_which_names_held_futures_of_the_controller_it_closed(ip, capsys):
    """``%pathways attach`` closes the old controller and its futures' buffers with it: the
    magic names the notebook's names that held them (before, nothing said so, and the next
    cell failed with ControllerClosedError); a value taken first is kept."""
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nw = jnp.ones(4) * 2\nstate = {'w': w, 'n': 1}\nw")
    run(ip, "kept = w.result()")
    capsys.readouterr()
    run(ip, "%pathways attach local")
    out = capsys.readouterr().out
    assert "note: state, w held futures of the old controller" in out, out
    assert "kept" not in out and "Out" not in out, out
    np.testing.assert_allclose(np.asarray(ip.user_ns["kept"]), 2.0)
    run(ip, "%pathways attach local")  # nothing of the second controller's is held: no note
    assert "note:" not in capsys.readouterr().out

def test_a_controller_that_cannot_start_is_a_one_line_usage_error():
    """A cell whose controller cannot be made (JAX set up with fewer devices before the first
    cell) gets one line saying how to fix it, as the line magics do, not a traceback through
    the runtime. (A fresh process: this one's JAX and controllers are set up already.)"""
    script = ("import os\nos.environ['PWKERNEL_ISLANDS'] = '8,8'\nimport jax\n"
              "jax.config.update('jax_num_cpu_devices', 8)\njax.devices()\n"
              "from IPython.core.interactiveshell import InteractiveShell\n"
              "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'pwkernel')\n"
              "for cell in ('%%pathways\\nx = jax.numpy.ones(2)', '%pathways slice s 2'):\n"
              "    r = ip.run_cell(cell)\n"
              "    print(type(r.error_in_exec).__name__, r.error_in_exec)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("UsageError")]
    assert len(lines) == 2 and all("need 16 CPU devices" in ln for ln in lines), done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_future_of_a_typed_key_shows_its_key_data(ip):
    """A typed PRNG key is no NumPy value: its Future (and the jax.Array) preview the key data
    it wraps, as the key's repr does, where they used to say '(freed)' and '(deleted)'."""
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nkey = jax.random.key(0)")
    fmt = ip.display_formatter
    data, _ = fmt.format(ip.user_ns["key"])
    assert "key<fry>[]" in data["text/plain"] and "key data [0 0]" in data["text/plain"]
    assert "key data [0 0]" in data["text/html"] and "freed" not in data["text/html"]
    data, _ = fmt.format(ip.user_ns["key"].result())
    assert "key data [0 0]" in data["text/html"] and "deleted" not in data["text/html"]
