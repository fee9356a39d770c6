"""A %%pathways cell on a simulated controller (``backend="sim"``): statements that need a
value run as plain Python; shapes, dtypes and shardings work there, only a value raises."""

from __future__ import annotations

import pytest

import pwkernel as pw
from pwkernel.notebook import extension
from tests.helpers.shell import run


@pytest.fixture
def sim(ip):
    run(ip, "%pathways attach sim --preset tpu-v4 --islands 8,8")
    assert extension.state().ctl.backend == "sim"
    try:
        yield ip
    finally:
        run(ip, "%pathways attach local --islands 4,4")


def test_a_plain_statement_reads_shapes_of_simulated_arrays(sim, capsys):
    run(sim, "%%pathways --devices 4\na = jnp.ones((64, 32))\nb = a @ a.T\n")
    capsys.readouterr()
    run(sim, "%%pathways --devices 4\nprint(a.shape, b.dtype)\nc = b * 2\n"
             "print(c.shape, len(c.sharding.device_set))\n")
    out = capsys.readouterr().out
    assert "(64, 32) float32" in out and "(64, 64) 4" in out
    assert isinstance(sim.user_ns["a"], pw.Future)  # not replaced by a value
    with pytest.raises(pw.NoValueError, match="simulated controller"):
        run(sim, "%%pathways --devices 4\nprint(float(b.sum()))\n")
    with pytest.raises(pw.NoValueError, match="simulated controller"):
        run(sim, "%%pathways --devices 4\nif a[0, 0] > 0:\n    d = a + 1\n")


def test_a_cell_that_ended_within_its_timeout_is_not_timed_out(sim, capsys):
    # The simulated run goes to its end on the virtual clock inside the cell's wait, which
    # takes real time; the deadline was checked before whether the run had ended, so a
    # finished cell raised CellTimeout and bound nothing.
    run(sim, "ctl = pw.controller()\nf = pw.function(lambda v: v * 2, slice=ctl.slice(4), "
             "sim_cost=1e-3)\nx = np.ones(8, np.float32)")
    run(sim, "%%pathways --devices 4 --timeout 1e-9\ny = f(f(x))\n")
    y = sim.user_ns["y"]
    assert isinstance(y, pw.Future) and y.done() and y.shape == (8,)
    assert sim.user_ns["ctl"].executor.now() > 2e-3  # both calls ran on the virtual clock
