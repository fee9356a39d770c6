"""The executor contract's optional members and the registry: a backend's ``compile`` hook
lowers its functions, its hint is checked where it is owned, each option reaches only the
backend that declares it, and ``status(island)`` facts are typed records the snapshot and
``ctl.status()`` are made from."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from pwkernel.runtime.executor import IslandFacts, create
from pwkernel.runtime.specialization import Specialization, compile_here


class Hooked(LocalBackend):
    """The local backend with the optional members: records what the runtime hands them."""

    def __init__(self, islands):
        super().__init__(islands)
        self.specs: list[Specialization] = []
        self.hints: list[tuple[str, object]] = []
        self.facts = IslandFacts()

    def compile(self, spec: Specialization):
        self.specs.append(spec)
        return compile_here(spec)

    def check_hint(self, name: str, hint) -> None:
        if hint == "refused":
            raise pw.ProgramError(f"{name}: this backend refuses {hint!r}")
        self.hints.append((name, hint))

    def status(self, island: int) -> IslandFacts:
        return self.facts


def test_a_compile_hook_lowers_the_functions_and_gets_the_hint():
    with pw.Controller(backend=Hooked((2, 2))) as ctl:
        backend = ctl.executor
        f = pw.function(lambda x, y: (x * 2, y), slice=ctl.slice(2, island=1), name="f",
                        sim_cost=0.5)
        assert backend.hints == [("f", 0.5)] and f.sim_cost == 0.5  # checked when made
        a, b = f(np.ones(2, np.float32), np.int32(3))
        assert a.result(timeout=60).tolist() == [2.0, 2.0] and int(b.result(timeout=60)) == 3
        (spec,) = backend.specs  # once per input signature
        assert spec.name == "f" and spec.hint == 0.5 and spec.slice is f.slice
        assert [s.shape for s in spec.structs] == [(2,), ()]
        assert [o.shape for o in spec.out_types] == [(2,), ()]
        assert spec.out_shardings == (None, None)  # inferred: left to whoever compiles
        f(np.zeros(2, np.float32), np.int32(1))[0].result(timeout=60)
        assert len(backend.specs) == 1
        with pytest.raises(pw.ProgramError, match="f: this backend refuses 'refused'"):
            pw.function(lambda x: x, slice=ctl.slice(1), name="f", sim_cost="refused")


def test_a_hint_is_unread_locally_but_a_bad_one_is_refused_where_it_is_written(ctl):
    """The local backend does not read sim_cost, yet a typo fails at pw.function (the same
    function may later run on backend="sim"): the registered simulator checks it."""
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1), sim_cost=1e-3)
    assert f(np.ones(1, np.float32)).result(timeout=60).tolist() == [2.0]
    with pytest.raises(pw.ProgramError, match="sim_cost must be seconds >= 0"):
        pw.function(lambda x: x + 1, slice=ctl.slice(1), sim_cost="whatever")


def test_the_simulator_checks_its_hint_when_the_function_is_made():
    with pw.Controller(backend="sim", islands=(8,)) as ctl:
        for bad in (-1, float("inf"), True, "1 ms"):
            with pytest.raises(pw.ProgramError, match="sim_cost must be seconds >= 0"):
                pw.function(lambda x: x, slice=ctl.slice(1), sim_cost=bad)
        step = pw.function(lambda x: x + 1, slice=ctl.slice(4), name="step", sim_cost=2e-3)
        y = step(np.ones(4, np.float32))
        y.wait()
        assert y.t_done > 2e-3  # the hint is its duration
        assert ctl.executor.cluster is not None and y.sharding.mesh.shape == {"x": 4}


@pytest.mark.parametrize("backend, option, value, owner", [
    ("local", "cluster", "tpu-v4", "sim"),
    ("local", "ray_address", "auto", "ray"),
    ("sim", "ray_address", "auto", "ray"),
    ("sim", "dcn", pw.Link(bandwidth=1e9, latency=0), "local"),
    ("ray", "cluster", "tpu-v4", "sim"),     # refused before Ray is started
    ("ray", "dcn", pw.Link(bandwidth=1e9, latency=0), "local"),
])
def test_an_option_of_another_backend_is_refused_naming_its_backend(backend, option, value,
                                                                    owner):
    with pytest.raises(ValueError) as info:
        pw.Controller(backend=backend, **{option: value})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{option}= is only for backend={owner!r}")
    assert f"not for backend={backend!r}" in message


def test_each_backend_gets_only_its_own_options():
    with pw.Controller(backend="sim", cluster="tpu-v4", islands=(8,)) as ctl:
        assert ctl.executor.cluster.name == "tpu-v4"
    with pytest.raises(TypeError, match="unexpected keyword argument 'cluster'"):
        LocalBackend((2,), cluster="tpu-v4")  # the local backend has no such option at all
    local = create("local", (2,), dcn=None, cluster=None, ray_address=None)  # None: not given
    local.close()


def test_island_facts_reach_the_snapshot_and_status_typed():
    with pw.Controller(backend=Hooked((2, 2))) as ctl:
        assert ctl.snapshot().island(0).lost is False
        assert "lost" not in ctl.status()["islands"][0]  # this backend cannot lose one
        ctl.executor.facts = IslandFacts(lost=True, details={"generation": 3})
        view = ctl.snapshot().island(1)
        assert view.lost is True and dict(view.facts.details) == {"generation": 3}
        island = ctl.status()["islands"][1]
        assert island["lost"] is True and island["generation"] == 3
        assert (island["running"], island["queued"]) == (0, 0)


def test_island_facts_from_a_plain_mapping():
    assert IslandFacts.of({}) == IslandFacts()
    facts = IslandFacts.of({"actor": "ab12", "lost": False, "generation": 1})
    assert facts.lost is False and dict(facts.details) == {"actor": "ab12", "generation": 1}
    with pytest.raises(TypeError, match="returns an IslandFacts"):
        IslandFacts.of(["lost"])
    with pytest.raises(TypeError):
        facts.details["actor"] = "x"  # frozen, as the snapshot holding it


@pytest.mark.parametrize("backend", ["local", "sim"])
def test_the_users_python_runs_once_per_input_signature(backend):
    """As under jax.jit: what is compiled (or lowered for simulated chips) is the recorded
    trace run again, not the function."""
    calls = []

    def body(x):
        calls.append(x.shape)
        return x * 2

    with pw.Controller(backend=backend, islands=(4,) if backend == "local" else (8,)) as ctl:
        f = pw.function(body, slice=ctl.slice(2))
        for n in (2, 2, 4):
            f(np.ones(n, np.float32)).wait(timeout=60)
    assert calls == [(2,), (4,)]
