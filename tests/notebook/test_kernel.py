"""Notebooks executed by nbclient on the real ``pwkernel`` kernel (ipykernel + %load_ext)."""

from __future__ import annotations

import asyncio
import re

from nbclient import NotebookClient

from pwkernel.notebook import kernelspec
from tests.helpers.kernel import execute, notebook, text


def test_kernelspec_runs_the_extension():
    spec = kernelspec.spec()
    assert spec["display_name"] == "Pathways (JAX)"
    assert spec["argv"][1:5] == ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["argv"][-2:] == ["--ext", "pwkernel"]


def test_kernelspec_install_twice_and_prefix_or_user(tmp_path, monkeypatch, capsys):
    """Installing again replaces the spec in place; ``--prefix`` with ``--user`` is refused
    (it used to install into the user's directory and drop ``--prefix`` without a word)."""
    import json

    import pytest

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "user"))  # where --user writes
    for _ in range(2):
        assert kernelspec.main(["install", "--prefix", str(tmp_path / "env")]) == 0
    dest = tmp_path / "env" / "share" / "jupyter" / "kernels" / kernelspec.NAME
    assert json.loads((dest / "kernel.json").read_text()) == kernelspec.spec()
    assert sorted(p.name for p in dest.iterdir()) == ["kernel.json"]
    with pytest.raises(SystemExit) as e:
        kernelspec.main(["install", "--prefix", str(tmp_path / "env"), "--user"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "user").exists()


def test_the_kernel_leaves_jax_alone_until_the_first_cell(kernel_env, monkeypatch):
    """A notebook that configures JAX in its first cell runs unchanged on this kernel."""
    monkeypatch.setenv("PWKERNEL_ISLANDS", "3,3")
    nb = execute(notebook(
        "from jax._src import xla_bridge\nstarted = xla_bridge.backends_are_initialized()\n"
        "import jax\njax.config.update('jax_num_cpu_devices', 6)\n"
        "print('backend started before:', started, 'devices:', len(jax.devices()))",
        "%pathways slice s 3",
    ))
    c = nb.cells
    assert "backend started before: False devices: 6" in text(c[0]), text(c[0])
    assert "s = slice x=3" in text(c[1]) and "devices [0, 1, 2]" in text(c[1]), text(c[1])


def test_sharded_cells_prints_and_bad_input(kernel_env):
    nb = execute(notebook(
        "import jax, numpy as np, jax.numpy as jnp, pwkernel as pw\n"
        "ctl = pw.controller(); print([len(i.devices) for i in ctl.islands])",
        "%pathways slice s0 4",
        "x = np.arange(8.0, dtype=np.float32)",
        "%%pathways --slice s0\ny = x * 10\njax.debug.print('first cell says {}', y.sum())",
        "print(sorted(d.id for d in y.sharding.device_set), y.result().tolist())",
        "%%pathways --slice s0 --no-block\nz = y + 1\n"
        "jax.debug.print('no-block cell says {}', z.sum())",
        "print('later', float(z.result().sum()))",
        "%%pathways --slice missing\nw = 1",
        "%%pathways --slice s0 --devices 2\nw = 1",
        "%%pathways\nw = (",
        "%pathways status",
        "print(ctl.runs())",
    ))
    c = nb.cells
    assert "[4, 4]" in text(c[0])
    assert "first cell says 280.0" in text(c[3])
    assert "[0, 1, 2, 3] [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]" in text(c[4])
    # The no-block cell's print shows in the no-block cell's own display, not the later one.
    assert "no-block cell says 288.0" in text(c[5])
    assert "no-block" not in text(c[6]) and "later 288.0" in text(c[6])
    assert "UsageError" in text(c[7]) and "%pathways slice missing" in text(c[7])
    assert "not allowed with argument --slice" in text(c[8])
    assert "syntax error in the cell at line 2" in text(c[9])
    assert "Memory per device" in text(c[10])
    assert "[]" in text(c[11])


class InterruptWhenStarted(NotebookClient):
    """Sends an interrupt as soon as the cell printed 'started' (its long part began)."""

    interrupted = False

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        if not self.interrupted and "started" in content.get("text", ""):
            self.interrupted = True
            asyncio.ensure_future(self.km.interrupt_kernel())
        return super().output(outs, msg, display_id, cell_index)


def test_interrupt_cancels_the_cell_and_the_kernel_survives(kernel_env):
    nb = execute(notebook(
        "import jax, numpy as np, jax.numpy as jnp, pwkernel as pw\nctl = pw.controller()\n"
        "s0 = ctl.slice(2, island=0)\n"
        "def start(v):\n    jax.debug.print('started')\n    return v\n"
        "def heavy(v):\n    m = jnp.eye(256, dtype=v.dtype)\n"
        "    return jax.lax.fori_loop(0, 40, lambda i, a: jnp.tanh(a @ m), v)\n"
        "st = pw.function(start, slice=s0); h = pw.function(heavy, slice=s0)\n"
        "x = np.ones((256, 256), np.float32)",
        # sequential: each step is launched once the one before it ended, so the interrupt
        # (sent when the first step prints) always finds most of them queued; in parallel
        # dispatch all 2000 may be launched into XLA before it arrives, and launched work
        # cannot be recalled, only waited for
        "%%pathways --sequential\ny = st(x)\nfor _ in range(2000):\n    y = h(y)",
        "ok = ctl.wait(120)\n"
        "print('after', ok, ctl.runs(), len([e for e in ctl.trace.events() "
        "if e.name == 'heavy']) < 2000)",
        "%%pathways --slice s0\nz = x[:2] * 3\nz",
    ), client_cls=InterruptWhenStarted)
    c = nb.cells
    assert "KeyboardInterrupt" in text(c[1]) and "cancelled" in text(c[1])
    # its traceback is the cell's %%pathways line, not the frame of magics.py that raised it
    (shown,) = [re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o.traceback))
                for o in c[1].outputs if o.output_type == "error"]
    assert "----> 1 %%pathways --sequential" in shown and "pwkernel/" not in shown, shown
    assert "after True [] True" in text(c[2])
    assert "float32[2,256]" in text(c[3]) and "done" in text(c[3])


def test_interrupting_a_plain_loop_of_calls_leaves_the_islands_working(kernel_env):
    """Ctrl-C in a cell that calls pw.function in a loop: the interrupt lands while the main
    thread is mostly inside the runtime, is raised after the call in hand, and the islands go
    on working (runtime/interrupts.py, put in place before every cell)."""
    nb = execute(notebook(
        "import signal, jax.numpy as jnp, pwkernel as pw\nctl = pw.controller()\n"
        "f = pw.function(lambda v: v * 0.5 + 1.0, slice=ctl.slice(4, island=0))\n"
        "x = jnp.ones(8); f(x).result()",
        "print('handler', signal.getsignal(signal.SIGINT).__module__)\n"
        "y = x\nprint('started', flush=True)\nfor _ in range(10**6):\n    y = f(y)",
        "print('after', ctl.wait(60), float(f(x).result(timeout=60)[0]))",
    ), client_cls=InterruptWhenStarted)
    c = nb.cells
    assert "handler pwkernel.runtime.interrupts" in text(c[1]), text(c[1])
    assert "KeyboardInterrupt" in text(c[1]), text(c[1])
    assert "after True 1.5" in text(c[2]), text(c[2])


def test_an_interrupt_in_the_cells_last_call_fails_that_cell(kernel_env):
    """Ctrl-C inside the cell's last runtime call (here: while it submits): the call ends
    whole, and the cell fails with the interrupt. Before, it was raised GRACE later, once the
    cell's code had ended: lost (ipykernel ignores SIGINT between cells), or raised in
    ipykernel's own code sending the cell's reply, which never came."""
    nb = execute(notebook(
        "import signal, sys, threading, jax.numpy as jnp, pwkernel as pw\n"
        "from pwkernel.runtime.dispatcher import Dispatcher\nctl = pw.controller()\n"
        "f = pw.function(lambda v: v * 0.5 + 1.0, slice=ctl.slice(4, island=0))\n"
        "x = jnp.ones(8); f(x).result()\n"
        "def in_submit(frame, event, _arg):  # waits there for the notebook's interrupt\n"
        "    if event == 'call' and frame.f_code is Dispatcher.submit.__code__:\n"
        "        sys.setprofile(None)\n        got = threading.Event()\n"
        "        ours = signal.getsignal(signal.SIGINT)\n"
        "        signal.signal(signal.SIGINT, lambda *a: (got.set(), ours(*a)))\n"
        "        print('started', flush=True)\n        got.wait(120)\n"
        "        signal.signal(signal.SIGINT, ours)",
        "sys.setprofile(in_submit)\ny = f(x)",
        "print('next', float(y.result(timeout=60)[0]), float(f(y).result(timeout=60)[0]), "
        "ctl.wait(60))",
    ), client_cls=InterruptWhenStarted)
    c = nb.cells
    assert "started" in text(c[1]) and "KeyboardInterrupt" in text(c[1]), text(c[1])
    assert "its results are bound" in text(c[1]), text(c[1])
    assert "next 1.5 1.75 True" in text(c[2]), text(c[2])


def test_an_interrupt_inside_a_free_is_raised_in_its_own_cell(kernel_env):
    """Ctrl-C while a cell's dropped future is freed (``state, loss = step(state, batch)``
    drops the old state): the free ends whole, then the interrupt is raised in that cell,
    soon, while the user's code runs on. Before, it was kept for the next runtime call, and
    the next cell's start (ipykernel puts its own SIGINT handler back) dropped it."""
    nb = execute(notebook(
        "import _thread, sys, time, jax.numpy as jnp, pwkernel as pw\n"
        "from pwkernel.runtime.store import ObjectStore\nctl = pw.controller()\n"
        "f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4, island=0))\n"
        "x = jnp.arange(8.0); y = f(x); y.wait()\n"
        "def inside_the_free(frame, event, _arg):\n"
        "    if event == 'call' and frame.f_code is ObjectStore._free.__code__:\n"
        "        sys.setprofile(None)\n        _thread.interrupt_main()",
        "sys.setprofile(inside_the_free)\ndel y\nend = time.monotonic() + 20\ntry:\n"
        "    while time.monotonic() < end:\n        pass\n"
        "    print('not raised', sys.getprofile())\nexcept KeyboardInterrupt:\n"
        "    print('raised in the cell')",
        "print('next cell', float(f(x).result(timeout=60)[0]), ctl.memory())",
    ))
    c = nb.cells
    assert "raised in the cell" in text(c[1]), text(c[1])
    assert "next cell 1.0" in text(c[2]) and "KeyboardInterrupt" not in text(c[2]), text(c[2])


def test_comm_target_answers_status(kernel_env):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=kernelspec.NAME, startup_timeout=120)
    try:
        comm_id = "pw-test-comm"

        def send(msg_type, content):
            msg = kc.session.msg(msg_type, content)
            kc.shell_channel.send(msg)

        def next_comm_msg():
            while True:
                msg = kc.get_iopub_msg(timeout=60)
                if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
                    return msg["content"]["data"]

        send("comm_open", {"comm_id": comm_id, "target_name": "pwkernel", "data": {}})
        first = next_comm_msg()  # before any cell: no controller, JAX untouched
        assert first["type"] == "status" and first["data"]["started"] is False
        kc.execute_interactive("%pathways status", timeout=120)  # starts the controller
        send("comm_msg", {"comm_id": comm_id, "data": {"type": "status"}})
        started = next_comm_msg()["data"]
        assert started["policy"] == "fifo" and len(started["islands"]) == 2
        send("comm_msg", {"comm_id": comm_id, "data": {"type": "launch"}})
        bad = next_comm_msg()
        assert bad["type"] == "error" and "status" in bad["error"]
        # unloading the extension closes the comm: the sidebar learns it went
        kc.execute("%unload_ext pwkernel")
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "comm_close":
                assert msg["content"]["comm_id"] == comm_id
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_viz_shows_a_live_schedule_of_the_cells_program(kernel_env):
    nb = execute(notebook(
        "import numpy as np, pwkernel as pw\nx = np.arange(8.0, dtype=np.float32)",
        "%pathways slice s0 2",
        "%%pathways --slice s0 --viz\ny = x * 2",
        "print('done', y.result().tolist())",
        "%%pathways --slice s0 --viz\nz = x * 3",
        # each cell's view stops following once its program has ended (nothing new can
        # enter it): no updater thread is left behind per run of a --viz cell
        "import threading\nup = [t for t in threading.enumerate() if t.name == "
        "'pwkernel-viz-updater']\n[t.join(60) for t in up]\n"
        "print('updaters', len(up), 'alive', sum(t.is_alive() for t in up))",
    ))
    viz = nb.cells[2]
    widgets = [o for o in viz.outputs if o.output_type == "display_data"
               and "application/vnd.jupyter.widget-view+json" in o.data]
    assert widgets, text(viz)
    assert "done [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]" in text(nb.cells[3])
    assert "alive 0" in text(nb.cells[5]), text(nb.cells[5])
