"""Device use for the sidebar (``notebook/usage.py``): this controller's utilization and, kept
apart, other tenants' (a shared pool's computations in the trace, ``tenant`` set)."""

from __future__ import annotations

import pytest

from pwkernel.notebook import comm
from pwkernel.notebook.usage import Utilization
from pwkernel.runtime.trace import Trace


def span(trace: Trace, t0: float, t1: float, devices: tuple[int, ...], tenant: str = "") -> None:
    trace.record(kind="compute", name="f", program=tenant or "p", program_id=-1,
                 client=f"{tenant}/default" if tenant else "default", island=0,
                 devices=devices, t_submit=t0, t_start=t0, t_end=t1, tenant=tenant)


def test_other_tenants_use_is_kept_apart_from_this_controllers():
    trace = Trace()
    span(trace, 9.0, 10.0, (0,))
    span(trace, 8.5, 9.5, (0, 1), tenant="bob")
    span(trace, 9.5, 10.0, (1,), tenant="carol")
    use = Utilization(window=2.0)
    own = use.sample(trace, running=[], now=10.0)
    assert own == {0: pytest.approx(0.5)}  # bob's and carol's time is not this controller's
    assert use.others == {0: {"bob": pytest.approx(0.5)},
                          1: {"bob": pytest.approx(0.5), "carol": pytest.approx(0.25)}}
    assert [e.tenant for e in use.recent] == ["carol", "bob"]  # newest first
    use.sample(trace, running=[], now=12.5)  # all ended before the window
    assert use.others == {} and use.recent == []


def test_a_controller_outside_a_pool_sends_no_pool_part(ctl):
    data = comm.status_message(ctl)["data"]
    assert "pool" not in data and all("others" not in d for d in data["devices"])
