"""The cost model: XLA's cost analysis on an abstract mesh, the roofline, and collectives over
the interconnect, checked against figures worked out by hand."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from pwkernel.backends.sim import (
    Chip,
    Cluster,
    Cost,
    HostCosts,
    Interconnect,
    Network,
    SimError,
    UncountedLoopWarning,
    abstract_mesh,
    analyze,
    estimate,
    lower,
)

US = 1e-6


def switch_cluster() -> Cluster:
    """Four chips behind one switch: 1 GB/s per chip, 1 us per step; 1 TFLOP/s, 100 GB/s."""
    return Cluster(Chip("toy", 1e12, 1e9, 1e11, launch_overhead=1 * US), (1,), 4,
                   Interconnect(1e9, 1 * US), Network(1e8, 5 * US),
                   HostCosts(1 * US, 1 * US, 10 * US, 2 * US, 1e9))


def test_matmul_work_is_split_over_the_axes_its_arrays_are_sharded_on():
    x = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    tpu = Cluster.preset("tpu-v4", chips=8)
    sharded = estimate(lambda x, w: x @ w, x, w, cluster=tpu, mesh=(4,), in_specs=(P("x"), P()))
    whole = 2 * 1024 * 512 * 256
    assert sharded.flops == pytest.approx(whole / 4)
    assert sharded.compute_seconds == pytest.approx(whole / 4 / 275e12)
    assert sharded.seconds == pytest.approx(
        max(sharded.compute_seconds, sharded.memory_seconds) + 2 * US)
    replicated = estimate(lambda x, w: x @ w, x, w, cluster=tpu, mesh=(4,))
    assert replicated.flops == pytest.approx(whole)  # every chip does all of it
    two_axes = estimate(lambda x, w: x @ w, x, w, cluster=tpu, mesh=(2, 4),
                        axis_names=("data", "model"), in_specs=(P("data"), P(None, "model")))
    assert two_axes.flops == pytest.approx(whole / 8)
    assert not sharded.has_collectives and sharded.source == "xla"


def test_a_large_matmul_is_compute_bound_and_an_elementwise_op_memory_bound():
    tpu = Cluster.preset("tpu-v4", chips=8)
    big = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    mm = estimate(lambda a: a @ a, big, cluster=tpu)
    assert mm.compute_seconds > mm.memory_seconds
    add = estimate(lambda a: a + 1, big, cluster=tpu)
    assert add.memory_seconds > add.compute_seconds
    assert add.memory_seconds == pytest.approx(add.bytes_accessed / 1.2e12)


def test_f32_matrix_products_run_at_the_chips_f32_peak():
    h100 = Cluster.preset("h100", chips=8)
    bf16 = estimate(lambda a: a @ a, jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16),
                    cluster=h100)
    f32 = estimate(lambda a: a @ a, jax.ShapeDtypeStruct((2048, 2048), jnp.float32),
                   cluster=h100)
    assert bf16.compute_seconds == pytest.approx(2 * 2048**3 / 989e12)
    assert f32.compute_seconds == pytest.approx(2 * 2048**3 / 494e12)


def test_shard_map_collectives_are_found_and_timed_on_the_interconnect():
    mesh = abstract_mesh((4,), ("x",))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    def f(v):  # one chip holds f32[256]: 1024 bytes
        s = jax.lax.psum(v, "x")
        g = jax.lax.all_gather(v, "x", tiled=True)
        p = jax.lax.ppermute(v, "x", [(i, (i + 1) % 4) for i in range(4)])
        a = jax.lax.all_to_all(v.reshape(4, 64), "x", 0, 0, tiled=True)
        r = jax.lax.psum_scatter(g, "x", tiled=True)
        return s + p + r + a.reshape(-1) + g[:256]

    cost = estimate(f, jax.ShapeDtypeStruct((1024,), jnp.float32), cluster=switch_cluster(),
                    mesh=mesh, in_specs=P("x"))
    assert sorted((c.kind, c.nbytes, c.group) for c in cost.collectives) == [
        ("all_gather", 4096, 4), ("all_reduce", 1024, 4), ("all_to_all", 1024, 4),
        ("collective_permute", 1024, 2), ("reduce_scatter", 4096, 4)]
    # rings over 4 chips at 1 GB/s, 3 steps of 1 us:
    # all-reduce 2 * (3/4 * 1024 ns + 3 us), all-gather and reduce-scatter 3/4 * 4096 ns
    # + 3 us, all-to-all 3/4 * 1024 ns + 3 us, permute 1024 ns + 1 us
    expected = (2 * (768 + 3000) + 2 * (3072 + 3000) + (768 + 3000) + (1024 + 1000)) * 1e-9
    assert cost.collective_seconds == pytest.approx(expected)
    assert cost.has_collectives
    assert cost.flops < 5 * 1024  # shard_map counts one chip's work: a few adds per element
    assert cost.seconds == pytest.approx(
        max(cost.compute_seconds, cost.memory_seconds) + 1 * US + expected)


@pytest.mark.parametrize("chips, perm", [(1, [(0, 0)]), (4, [(i, i) for i in range(4)])],
                         ids=["one chip", "identity"])
def test_a_permute_of_each_chip_to_itself_crosses_no_link(chips, perm):
    """``ppermute`` on a one-chip slice (a ring step written for n chips, run on 1) or by the
    identity sends nothing: it was timed as the whole operand sent over a link (1 us + 1024
    ns here; 1.5 ms for 64 MiB on a v4 chip, 13 times the step's compute)."""
    f = jax.shard_map(lambda v: jax.lax.ppermute(v, "x", perm), in_specs=P("x"),
                      out_specs=P("x"))
    cost = estimate(f, jax.ShapeDtypeStruct((256 * chips,), jnp.float32),
                    cluster=switch_cluster(), mesh=chips, in_specs=P("x"))
    assert [(c.kind, c.group) for c in cost.collectives] == [("collective_permute", 1)]
    assert cost.collective_seconds == 0


def test_torus_collectives_use_a_ring_in_each_dimension_they_span():
    ici = Cluster.preset("tpu-v4", chips=2048).ici
    assert ici.torus == (16, 16, 8)
    bw, latency, steps = ici.group_links(256)  # spans 16 x 16
    assert (bw, latency, steps) == (2 * 2 * 45e9, 1 * US, 30)
    assert ici.collective_seconds("all_reduce", 1 << 20, 256) == pytest.approx(
        2 * (255 / 256 * (1 << 20) / (4 * 45e9) + 30 * US))
    assert ici.collective_seconds("all_gather", 1 << 20, 1) == 0.0


def test_analysis_of_a_lowered_function_is_per_chip():
    mesh = abstract_mesh((8,))
    lowered = lower(lambda a: a * 2, [jax.ShapeDtypeStruct((8, 1024), jnp.float32)], mesh,
                    in_specs=P("x"), out_specs=P("x"))
    a = analyze(lowered, mesh)
    assert a.shards == 8 and a.flops == pytest.approx(8 * 1024 / 8, rel=1e-3)
    assert a.collectives == ()


def test_a_given_duration_and_bad_input():
    assert Cost.given(2e-3) == Cost(2e-3, source="given")
    assert Cost.given(1e-3, collectives=True).has_collectives
    with pytest.raises(SimError, match=r"e.g. Cost.given\(1e-3\)"):
        Cost.given(-1.0)
    with pytest.raises(SimError, match=r"Maybe you want to give its duration instead"):
        estimate(lambda a: a[0].item(), jax.ShapeDtypeStruct((4,), jnp.float32),
                 cluster=switch_cluster())
    with pytest.raises(SimError, match="one name per axis"):
        abstract_mesh((2, 2), ("x",))
    with pytest.raises(SimError, match="mesh=\\(256, 8\\)"):
        abstract_mesh((0,))
    # a spec naming an axis the default mesh (x, y) lacks was JAX's bare ValueError
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    for specs in ((P("data"), P(None, "model")), (P(("x", "model")), P())):
        with pytest.raises(SimError, match=r"names axis '(data|model)', but the mesh "
                                           r"\{'x': 2, 'y': 2\} has axes \('x', 'y'\). Maybe you "
                                           r"want axis_names="):
            estimate(lambda a, b: a @ b, x, x, cluster=switch_cluster(), mesh=(2, 2),
                     in_specs=specs)
    with pytest.raises(SimError, match="names axis 'model'"):
        estimate(lambda a: a, x, cluster=switch_cluster(), mesh=(4,), out_specs=P("model"))


def test_estimate_takes_python_scalars_as_jit_does_and_a_presets_name():
    # a Python scalar argument was an AttributeError (no .dtype); jax.jit types it weakly,
    # so it keeps a bf16 array bf16 where a float32 scalar would widen the product
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    weak = jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)
    strong = jax.ShapeDtypeStruct((), jnp.float32)
    c = switch_cluster()

    def scale(a, s):
        return a * s

    by_scalar = estimate(scale, x, 2.0, cluster=c)
    assert by_scalar == estimate(scale, x, weak, cluster=c)
    assert by_scalar.bytes_accessed < estimate(scale, x, strong, cluster=c).bytes_accessed
    assert estimate(scale, x, 3, cluster=c).flops == by_scalar.flops
    # cluster= takes a preset's name, as pw.Controller(backend="sim", cluster=...) does
    assert estimate(scale, x, 2.0, cluster="tpu-v4") == estimate(
        scale, x, 2.0, cluster=Cluster.preset("tpu-v4"))
    with pytest.raises(SimError, match=r"cluster= must be a pw.sim.Cluster or a preset's "
                                       r"name, got int. Maybe you want cluster='tpu-v4'"):
        estimate(scale, x, 2.0, cluster=4)


def test_loops_of_known_length_count_every_trip():
    # XLA's cost analysis counts a loop's body once: a 100-step scan was timed as one step
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    tpu = Cluster.preset("tpu-v4", chips=8)
    product = 2 * 512**3  # flops of one 512 x 512 matrix product

    def scan(a):
        return jax.lax.scan(lambda b, _: (b @ a, None), a, None, length=100)[0]

    def fori(a):  # static bounds: JAX writes it as a scan
        return jax.lax.fori_loop(0, 100, lambda i, b: b @ a, a)

    def nested(a):  # 4 x (5 + 1) products, one of them in a jit inside the loop
        def outer(b, _):
            b = jax.jit(lambda v: jax.lax.fori_loop(0, 5, lambda i, u: u @ a, v))(b)
            return b @ a, None
        return jax.lax.scan(outer, a, None, length=4)[0]

    def unrolled(k):  # XLA lowers k bodies in the loop and 100 % k after it: not counted twice
        return lambda a: jax.lax.scan(lambda b, _: (b @ a, None), a, None, length=100,
                                      unroll=k)[0]

    for f, products in ((scan, 100), (fori, 100), (nested, 24), (unrolled(3), 100),
                        (unrolled(True), 100)):
        assert estimate(f, x, cluster=tpu, mesh=(1,)).flops == pytest.approx(
            products * product, rel=1e-3)
        # sharded over 8 chips: each does an eighth
        assert estimate(f, x, cluster=tpu, mesh=(8,), in_specs=P("x"),
                        out_specs=P("x")).flops == pytest.approx(products * product / 8, rel=1e-3)

    def data_dependent(a):  # a while_loop's trip count is data: still counted once
        return jax.lax.while_loop(lambda s: s[0] < 100, lambda s: (s[0] + 1, s[1] @ a),
                                  (0, a))[1]

    with pytest.warns(UncountedLoopWarning):  # (and says so)
        assert estimate(data_dependent, x, cluster=tpu, mesh=(1,)).flops == pytest.approx(
            product, rel=1e-3)


def test_a_simulated_pw_function_with_a_scan_takes_every_trip():
    import numpy as np

    import pwkernel as pw

    tpu = Cluster.preset("tpu-v4", chips=8)
    with pw.Controller(backend="sim", cluster=tpu) as ctl:
        s = ctl.slice(8, axis_names=("x",))
        w = np.ones((1024, 1024), jnp.bfloat16)
        f = pw.function(lambda a, w: jax.lax.scan(lambda b, _: (b @ w, None), a, None,
                                                  length=100)[0],
                        slice=s, in_specs=(P("x"), P()), out_specs=P("x"))
        f(np.ones((8192, 1024), jnp.bfloat16), w).wait()
        step = next(e for e in ctl.trace.events() if e.kind == "compute")
        # 100 products of (1024 rows per chip) x 1024 x 1024 at 275 TFLOP/s, plus 2 us
        compute = 100 * 2 * 1024 * 1024 * 1024 / 275e12
        assert step.t_end - step.t_start == pytest.approx(compute + 2 * US, rel=0.05)


def test_a_loop_inside_shard_map_counts_every_trip_of_one_shard():
    # a loop inside shard_map was counted once (its body was not lowered on its own), so a
    # data-parallel step written with shard_map lost all but one of its layers' work
    tpu = Cluster.preset("tpu-v4", chips=8)
    mesh = abstract_mesh((8,))
    a, w = jax.ShapeDtypeStruct((4096, 512), jnp.float32), jax.ShapeDtypeStruct((512, 512),
                                                                               jnp.float32)

    def looped(a, w):
        return jax.lax.fori_loop(0, 100, lambda i, b: b @ w, a)

    mapped = partial(jax.shard_map, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    with_sum = mapped(lambda a, w: looped(a, w) + jax.lax.psum(jnp.sum(w), "x"))
    for f in (mapped(looped), with_sum):
        # 100 products of one shard's 512 rows x 512 x 512 on each chip
        assert estimate(f, a, w, cluster=tpu, mesh=mesh).flops == pytest.approx(
            100 * 2 * 512**3, rel=1e-2)

    def collective_inside(a, w):  # a body that runs a psum: still counted once
        return jax.lax.fori_loop(0, 100, lambda i, b: b @ w + jax.lax.psum(b[0, 0], "x"), a)

    assert estimate(mapped(collective_inside), a, w, cluster=tpu, mesh=mesh).flops < (
        2 * 2 * 512**3)


def test_a_cost_is_forgotten_with_its_executable():
    """The simulator kept every executable it had costed (and its jaxpr and lowering) for as
    long as the controller lived, and after it closed: a notebook cell that makes a function
    again on a simulated controller, run again and again, held one more each time."""
    import gc

    import numpy as np

    import pwkernel as pw
    from pwkernel.runtime.executable import Executable

    def held() -> int:
        gc.collect()
        return sum(isinstance(o, Executable) for o in gc.get_objects())

    with pw.Controller(backend="sim", cluster=Cluster.preset("tpu-v4", chips=8)) as ctl:
        s, counts = ctl.slice(8), []
        for _ in range(3):  # the cell run again: a new function each time
            f = pw.function(lambda a: a @ a, slice=s, in_specs=P("x"), out_specs=P("x"))
            f(np.ones((64, 64), np.float32)).wait()
            del f
            counts.append(held())
        assert counts[2] == counts[0], counts


def test_a_loop_whose_trip_count_is_data_is_flagged_as_counted_once():
    # XLA counts a while_loop's body once and a simulation never computes the trip count: the
    # duration is too short, and the user is told so (it was silent), once per executable.
    import warnings

    import numpy as np

    import pwkernel as pw

    def halving(x):  # runs until the data says so
        return jax.lax.while_loop(lambda v: v.sum() > 1.0, lambda v: v * 0.5, x)

    def twice(x):  # two loops: one inside the other's body
        def body(v):
            return jax.lax.while_loop(lambda u: u[0] > 0, lambda u: u - 1, v) * 0.5
        return jax.lax.while_loop(lambda v: v.sum() > 1.0, body, x)

    x = jax.ShapeDtypeStruct((1024,), jnp.float32)
    with pytest.warns(UncountedLoopWarning, match=r"^halving: .* body of a while_loop once"):
        estimate(halving, x, cluster=switch_cluster())
    with pytest.warns(UncountedLoopWarning, match=r"^twice: .* body of 2 while_loops once"):
        estimate(twice, x, cluster=switch_cluster())

    with pw.Controller(backend="sim", cluster=switch_cluster()) as ctl:
        s = ctl.slice(4)
        fns = {name: pw.function(fn, slice=s, name=name, **kw) for name, fn, kw in (
            ("data", halving, {}),
            ("given", halving, {"sim_cost": 1e-3}),  # the user said how long: no warning
            ("static", lambda v: jax.lax.fori_loop(0, 8, lambda i, u: u * 0.5, v), {}))}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for name in ("data", "data", "given", "static"):  # "data" twice: one executable
                fns[name](np.ones(1024, np.float32)).wait(timeout=30)
        said = [str(w.message) for w in seen if w.category is UncountedLoopWarning]
        assert len(said) == 1 and said[0].startswith("data: ") and "sim_cost=seconds" in said[0]
        given = [e for e in ctl.trace.events() if e.name == "given"]
        assert len(given) == 1 and given[0].t_end - given[0].t_start == pytest.approx(1e-3)


def test_output_shardings_add_no_memory_traffic():
    """Per chip, a forward of 4 chips' shards: x (16 x 256 f32, 16 KiB) @ w (256 x 256, 256
    KiB, replicated) reads 272 KiB and writes 16 KiB; tanh reads and writes 16 KiB each: 320
    KiB, given out_specs or not. Given them, JAX's HLO keeps each output's sharding on a dead
    reshape of the whole array (which XLA removes before it partitions), and that counted
    128 KiB more per output."""
    def fwd(w, x):
        h = x @ w
        return jnp.tanh(h), h
    per_chip = jax.shard_map(fwd, in_specs=(P(), P("x")), out_specs=P("x"), check_vma=False)
    w, x = (jax.ShapeDtypeStruct(s, jnp.float32) for s in ((256, 256), (64, 256)))
    by_hand = 4 * 256 * 256 + 4 * 16 * 256 * 4
    for fn, expected in ((per_chip, by_hand),
                         (fwd, (4 * 256 * 256 + 4 * 64 * 256 * 4) / 4)):  # (whole / chips)
        for outs in (None, (P("x"), None), (P("x"), P("x"))):
            cost = estimate(fn, w, x, cluster="tpu-v4", mesh=(4,), in_specs=(None, P("x")),
                            out_specs=outs)
            assert cost.bytes_accessed == pytest.approx(expected, rel=1e-3), (fn, outs)


V4_PEAK, V4_HBM = 275e12, 1.2e12  # TPU v4: bf16 flop/s, HBM bytes/s


def test_cumulative_reductions_are_timed_as_a_log_depth_tree():
    """XLA counts a cumulative reduction, lowered for TPU as a reduce_window as wide as its
    axis, as L - 1 steps for each element (a 2^20-element cumsum: 1.1e12 flops, 4 ms on v4);
    the compiled kernel runs ceil(log2 L) steps and reads and writes the array once."""
    tpu = Cluster.preset("tpu-v4", chips=8)
    n = 2**20
    cost = estimate(jnp.cumsum, jax.ShapeDtypeStruct((n,), jnp.float32), cluster=tpu, mesh=(1,))
    assert cost.flops == pytest.approx(n * 20)
    assert cost.bytes_accessed == pytest.approx(2 * 4 * n, rel=1e-6)
    assert cost.seconds == pytest.approx(2 * 4 * n / V4_HBM + 2 * US, rel=1e-3)  # ~9 us
    # top-p sampling: a cumsum over a 50,257-word vocabulary for 8 rows (16 steps)
    probs = jax.ShapeDtypeStruct((8, 50257), jnp.float32)
    top_p = estimate(lambda p: jnp.cumsum(p, axis=-1), probs, cluster=tpu, mesh=(1,))
    assert top_p.flops == pytest.approx(8 * 50257 * 16)
    assert top_p.bytes_accessed == pytest.approx(2 * 4 * 8 * 50257, rel=1e-6)
    # any cumulative reduction, either way along any axis, any type: 1024 rows, 10 steps
    square = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    for op in (jax.lax.cummax, jax.lax.cumprod, jax.lax.cumsum):
        c = estimate(lambda a, op=op: op(a, axis=0, reverse=True), square, cluster=tpu, mesh=(1,))
        assert c.flops == pytest.approx(1024 * 1024 * 10, rel=1e-3), op
        assert c.bytes_accessed == pytest.approx(2 * 2 * 1024 * 1024, rel=1e-5), op
    # every trip of a scan: 10 cumsums of 2^16 elements, 16 steps each
    x = jax.ShapeDtypeStruct((2**16,), jnp.float32)
    looped = estimate(lambda v: jax.lax.scan(lambda c, _: (jnp.cumsum(c), None), v, None,
                                             length=10)[0], x, cluster=tpu, mesh=(1,))
    assert looped.flops == pytest.approx(10 * 2**16 * 16, rel=1e-3)
    # inside shard_map, one shard's: 8 chips, each a row of 2^17 (17 steps), 1 MiB in and out
    rows = jax.ShapeDtypeStruct((8, 2**17), jnp.float32)
    mapped = jax.shard_map(lambda r: jnp.cumsum(r, axis=1), mesh=abstract_mesh((8,)),
                           in_specs=P("x"), out_specs=P("x"))
    per_chip = estimate(mapped, rows, cluster=tpu, mesh=(8,), in_specs=P("x"))
    assert per_chip.flops == pytest.approx(2**17 * 17, rel=1e-3)
    assert per_chip.memory_seconds == pytest.approx(2 * 4 * 2**17 / V4_HBM, rel=1e-3)


def test_random_bits_are_one_fused_kernel():
    """XLA counts the threefry hash behind jax.random as some hundred element-wise steps,
    each a read and a write of the whole array (2^20 uniform draws: 1.8 GB, 1.5 ms on v4);
    fused, it reads the key (8 bytes) and writes the bits."""
    tpu = Cluster.preset("tpu-v4", chips=8)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    n = 2**20
    bits = estimate(lambda k: jax.random.bits(k, (n,)), key, cluster=tpu, mesh=(1,))
    assert bits.bytes_accessed == pytest.approx(4 * n + 8, rel=1e-6)
    assert bits.seconds == pytest.approx((4 * n + 8) / V4_HBM + 2 * US, rel=1e-3)  # ~5.5 us
    # what the draws add stays unfused: uniform's 8 element-wise steps and the comparison,
    # each reading and writing at most 12 bytes an element and its scalars broadcast (4
    # bytes), normal's erf_inv in and out and its scale: under 160 bytes an element
    # (before: over 1,700)
    for draw in (lambda k: jax.random.uniform(k, (n,)), lambda k: jax.random.normal(k, (n,)),
                 lambda k: jax.random.bernoulli(k, 0.9, (n,))):
        assert estimate(draw, key, cluster=tpu, mesh=(1,)).bytes_accessed < 160 * n
    # a dropout mask over (8, 2048, 4096) activations, sharded over 8 chips: ~100 ms before
    mask = jax.ShapeDtypeStruct((8, 2048, 4096), jnp.bfloat16)
    dropout = estimate(lambda k, a: jnp.where(jax.random.bernoulli(k, 0.9, a.shape), a, 0),
                       key, mask, cluster=tpu, mesh=(8,), in_specs=(P(), P("x")),
                       out_specs=P("x"))
    assert dropout.seconds < 2**26 / 8 * 160 / V4_HBM  # < 1.2 ms a chip


def test_a_simulated_pw_function_times_a_cumsum_as_its_kernel_runs():
    import numpy as np

    import pwkernel as pw
    from pwkernel.backends.sim import xla_cost

    tpu = Cluster.preset("tpu-v4", chips=8)
    with pw.Controller(backend="sim", cluster=tpu) as ctl:
        s = ctl.slice(8, axis_names=("x",))
        f = pw.function(lambda a: jnp.cumsum(a, axis=1), slice=s, in_specs=P("x"),
                        out_specs=P("x"), name="prefix_sum")
        x = np.ones((8, 2**18), np.float32)
        f(x).wait()
        step = next(e for e in ctl.trace.events() if e.kind == "compute")
        # each chip: a row of 2^18 f32 read and written once (1 MiB each way) at 1.2 TB/s
        by_hand = 2 * 4 * 2**18 / V4_HBM + 2 * US
        assert step.t_end - step.t_start == pytest.approx(by_hand, rel=1e-3)
        node = next(n for n in pw.program(lambda a: f(a)).trace(x).nodes
                    if n.name == "prefix_sum")
        assert xla_cost(tpu)(node).seconds == pytest.approx(by_hand, rel=1e-3)
