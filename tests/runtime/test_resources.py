"""Islands, virtual slices, placement and remapping."""

from __future__ import annotations

import gc
import threading

import jax
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.executable import Executable


def test_islands_are_the_host_split_into_virtual_devices(ctl):
    assert [len(i.devices) for i in ctl.islands] == [4, 4]
    assert [i.id for i in ctl.islands] == [0, 1]
    assert {i.platform for i in ctl.islands} == {"cpu"}
    ids = [d.id for i in ctl.islands for d in i.devices]
    assert len(set(ids)) == 8


def test_slice_has_a_mesh_over_its_devices(ctl):
    s = ctl.slice((2, 2), island=1, axis_names=("data", "model"))
    assert isinstance(s.mesh, jax.sharding.Mesh)
    assert dict(s.mesh.shape) == {"data": 2, "model": 2}
    assert s.island.id == 1 and set(s.devices) <= set(ctl.islands[1].devices)
    assert ctl.slice(3).axis_names == ("x",)


def test_slices_carry_axis_types_defaulting_to_what_make_mesh_gives(ctl):
    from jax.sharding import AxisType

    made = jax.make_mesh((2, 2), ("x", "y"), devices=ctl.islands[0].devices).axis_types
    s = ctl.slice((2, 2))
    assert s.axis_types == made == s.mesh.axis_types  # explicit in today's JAX
    auto = ctl.slice((2, 2), axis_types="auto")
    assert auto.mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    assert "auto" in repr(auto) and auto.axis_type_names == ("auto", "auto")
    mixed = ctl.slice((2, 2), axis_types=(AxisType.Explicit, "Auto"))
    assert mixed.axis_types == (AxisType.Explicit, AxisType.Auto)
    assert "explicit,auto" in repr(mixed)
    ctl.remap(auto, island=1)  # a moved slice keeps its types
    assert auto.mesh.axis_types == (AxisType.Auto, AxisType.Auto)


def test_placement_spreads_load_over_islands_and_devices(ctl):
    a, b = ctl.slice(2), ctl.slice(2)
    assert {a.island.id, b.island.id} == {0, 1}
    c = ctl.slice(2, island=0)
    same = a if a.island.id == 0 else b
    assert set(c.device_ids).isdisjoint(same.device_ids)  # least loaded devices first


def test_placement_takes_free_devices_before_sharing_a_busy_one():
    """An island whose devices are less loaded on average, but not free enough for the slice,
    loses to one with enough free devices (it used to put the slice on a busy device while
    two stood idle on the other island)."""
    with pw.Controller(islands=(6, 2)) as ctl:
        ctl.slice(4, island=0)          # island 0: 4 of 6 devices busy (2/3 on average)
        ctl.slice(1, island=1)          # island 1: 1 of 2 busy (1/2 on average)
        s = ctl.slice(2)
        assert s.island.id == 0 and s.device_ids == (4, 5)


def test_slices_may_share_devices(ctl):
    full = [ctl.slice(4, island=0) for _ in range(3)]
    assert all(s.device_ids == full[0].device_ids for s in full)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shape=5, island=0), "does not fit on island 0, which has 4"),
        (dict(shape=9), "does not fit on any island"),
        (dict(shape=2, island=7), "island 7 does not exist"),
        (dict(shape=1, island=True), "island True does not exist"),
        (dict(shape=1, devices="0"), "got '0'. Maybe you want devices=\\[0\\]"),
        (dict(shape=2, devices=[True, 0]), "distinct device ids"),
        (dict(shape=(0, 2)), "positive"),
        (dict(shape=(2, 2), axis_names=("a",)), "must name each"),
        (dict(shape=(2, 2), axis_types="manual"), "must be 'explicit' or 'auto'"),
        (dict(shape=(2, 2), axis_types=("auto",) * 3), "Maybe you want axis_types='explicit'"),
        # (these raised a bare "'int' object is not iterable", or were taken: a name that is
        # no string, or empty, breaks the views and specs that show the slice's axes)
        (dict(shape=2, axis_types=5), "Maybe you want axis_types='explicit'"),
        (dict(shape=2, axis_names=5), "Maybe you want axis_names=\\('x',\\)"),
        (dict(shape=2, axis_names=(1,)), "non-empty strings"),
        (dict(shape=(2, 2), axis_names=("x", "")), "non-empty strings"),
    ],
)
def test_bad_slices_say_what_exists(ctl, kwargs, match):
    with pytest.raises(pw.SliceError, match=match):
        ctl.slice(**kwargs)
    with pytest.raises(ValueError):  # SliceError is a ValueError
        ctl.slice(**kwargs)


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(shape=5, island=0), "Maybe you want ctl.slice(4, island=0), or a controller "
                                  "with an island that large, e.g. pw.Controller(islands=(5,))"),
        (dict(shape=9), "maybe you want ctl.slice(4), or a controller"),
        (dict(shape=2, devices=[3, 4]), "Maybe you want devices=[0, 1]."),
        (dict(shape=2, devices=[4, 5], island=0), "not all on island 0; a slice lives on one "
                                                  "island"),
        (dict(shape=5, devices=range(5)), "Maybe you want a controller with an island"),
    ],
)
def test_slices_that_fit_no_island_name_a_fix(ctl, kwargs, fix):
    """These said only what the islands hold, not what to do."""
    with pytest.raises(pw.SliceError) as e:
        ctl.slice(**kwargs)
    assert fix in str(e.value)


def test_a_slice_too_big_for_the_island_asked_names_the_one_it_fits():
    with pw.Controller(islands=(2, 6)) as ctl:
        with pytest.raises(pw.SliceError, match=r"Maybe you want island=1 \(or leave"):
            ctl.slice(5, island=0)


def test_a_refused_slice_holds_no_devices(ctl):
    before = ctl.snapshot()
    for kwargs in (dict(axis_names=(1,)), dict(axis_types=5), dict(devices=[0, 4]),
                   dict(island=3)):
        with pytest.raises(pw.SliceError):
            ctl.slice(2, **kwargs)
    assert ctl.slices == () and ctl.snapshot() == before
    assert ctl.slice(4).device_ids == (0, 1, 2, 3)  # nothing counted against island 0
    axis_names = (n for n in ("data", "model"))  # any iterable of names, as before
    assert ctl.slice((2, 2), axis_names=axis_names).axis_names == ("data", "model")


def test_a_slice_made_in_place_of_another_keeps_its_devices(ctl):
    old = ctl.slice(2)
    new = ctl.slice(2, replacing=old)
    assert old.released and new.device_ids == (0, 1) and ctl.slices == (new,)
    with pytest.raises(pw.SliceError, match="does not fit"):
        ctl.slice(8, replacing=new)  # refused: the one it would replace stays, still counted
    assert not new.released and ctl.slice(2).device_ids == (4, 5)
    with pytest.raises(pw.SliceError, match=r"replacing= takes a slice of this controller "
                                            r"that is not released, got slice \d+, released"):
        ctl.slice(2, replacing=old)
    with pytest.raises(pw.SliceError, match="got int. Maybe you want replacing=None"):
        ctl.slice(2, replacing=3)


def test_released_slice_cannot_be_used(ctl):
    s = ctl.slice(2)
    s.release()
    with pytest.raises(pw.SliceError, match="released"):
        _ = s.mesh
    with pytest.raises(pw.SliceError, match="released"):
        pw.function(lambda x: x, slice=s)(np.ones(2))


def test_functions_and_programs_called_before_a_release_refuse_it_after(ctl):
    """A call whose signature was traced before the release raises as a new one does (it used
    to run on the released slice's devices from the cached graph)."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    a = pw.function(lambda x: x * 2, slice=s0)
    c = pw.function(lambda x: x + 1, slice=s1)

    @pw.program
    def two_islands(v):
        return c(a(v))

    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(two_islands(x).result(60), 3 * x)
    np.testing.assert_array_equal(c(x).result(60), 2 * x)
    s1.release()
    for call in (lambda: c(x), lambda: two_islands(x)):
        with pytest.raises(pw.SliceError, match=f"slice {s1.id} was released"):
            call()
    np.testing.assert_array_equal(a(x).result(60), 2 * x)  # the other slice carries on


def test_remap_moves_a_slice_and_functions_are_lowered_again(ctl):
    s = ctl.slice(2, island=0)
    f = pw.function(lambda x: x * 3, slice=s)
    y = f(np.arange(4.0))
    assert y.island == 0
    assert y.result().tolist() == [0.0, 3.0, 6.0, 9.0]
    ctl.remap(s, island=1)
    assert s.island.id == 1 and s.version == 1
    z = f(np.arange(4.0))
    assert z.island == 1
    assert {d.id for d in z.result().sharding.device_set} <= set(ctl.islands[1].device_ids)
    assert z.result().tolist() == [0.0, 3.0, 6.0, 9.0]
    # a future made before the move flows into the moved function through a transfer
    w = f(y)
    assert w.result().tolist() == [0.0, 9.0, 18.0, 27.0]
    assert any(e.kind == "transfer" and e.link == "dcn" for e in ctl.trace.events())


def test_a_function_keeps_nothing_compiled_for_where_its_slice_was(ctl):
    # what was compiled for the slice's old place is never run again: kept, it grew by one
    # executable per remap (a kernel open all day that moves a slice back and forth)
    def executables() -> int:
        gc.collect()
        return sum(isinstance(o, Executable) for o in gc.get_objects())

    s = ctl.slice(2, island=0)
    f = pw.function(lambda x: x * 3, slice=s)
    f(np.arange(4.0)).result()
    before = executables()
    for n in range(20):
        ctl.remap(s, island=(n + 1) % 2)
        assert f(np.arange(4.0)).result().tolist() == [0.0, 3.0, 6.0, 9.0]
    assert executables() <= before


def test_a_remap_waits_for_the_traces_of_other_threads(ctl):
    """A trace reads its slices' devices many times: a remap from another thread waits until
    it ends (else its graph could place inputs on the old devices for a computation compiled
    for the new ones); a program that remaps while it is traced goes on."""
    s = ctl.slice(2, island=0)
    double = pw.function(lambda x: x * 2, slice=s)
    entered, release, moved, got = (threading.Event(), threading.Event(), threading.Event(),
                                    [])

    @pw.program
    def twice(x):
        y = double(x)
        entered.set()
        assert release.wait(60)
        return double(y)

    caller = threading.Thread(target=lambda: got.append(twice(np.ones(2)).result(60)))
    mover = threading.Thread(target=lambda: (ctl.remap(s, island=1), moved.set()))
    caller.start()
    assert entered.wait(60)
    mover.start()
    assert not moved.wait(0.5)  # (a negative check: it cannot pass early, only late)
    release.set()
    caller.join(60)
    mover.join(60)
    assert moved.is_set() and got[0].tolist() == [4.0, 4.0] and s.island.id == 1
    assert twice(np.ones(2)).result(60).tolist() == [4.0, 4.0]  # traced again, on island 1

    @pw.program
    def moving(x):
        ctl.remap(s, island=0)  # its own thread's trace: no wait
        return double(x)

    assert moving(np.ones(2)).result(60).tolist() == [2.0, 2.0] and s.island.id == 0


def test_two_programs_that_remap_while_traced_in_two_threads_do_not_wait_on_each_other(ctl):
    """Each remap waits for the other thread's trace to end: two programs traced at once that
    each remap inside would wait forever. The second to ask is refused at once (SliceError,
    saying why); the first moves once that trace has ended, and its program runs."""
    one, two = ctl.slice(1, island=0), ctl.slice(1, island=0)
    inside = {s.id: threading.Event() for s in (one, two)}
    got: dict[int, object] = {}

    def moving_program(s, other):
        f = pw.function(lambda x: x + 1, slice=s)

        @pw.program
        def body(x):
            y = f(x)
            inside[s.id].set()
            assert inside[other.id].wait(60)  # both traces are under way
            ctl.remap(s, island=1)
            return f(y)

        def call():
            try:
                got[s.id] = body(np.zeros(2, np.float32)).result(60)
            except pw.SliceError as e:
                got[s.id] = e
        return threading.Thread(target=call, daemon=True)

    threads = [moving_program(one, two), moving_program(two, one)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "the two remaps wait for each other"
    refused = [v for v in got.values() if isinstance(v, pw.SliceError)]
    ran = [v for v in got.values() if not isinstance(v, pw.SliceError)]
    assert len(refused) == 1 and "another thread" in str(refused[0]), got
    assert len(ran) == 1 and np.asarray(ran[0]).tolist() == [2.0, 2.0], got


def test_a_call_runs_where_it_was_traced_if_the_slice_moves_before_it_is_submitted(ctl):
    """Another thread's remap can land between a call finding its graph (traced for the
    slice's devices then) and submitting it: the call runs the executable it was traced
    with, on those devices, not one compiled for the new ones (XLA refused the old inputs
    with a sharding mismatch). The remap lands there every time here: ``ctl.submit`` makes
    it, as another thread would."""
    s = ctl.slice(2, island=0)
    f = pw.function(lambda x: x + 1, slice=s)
    submit = ctl.submit
    moves = []

    def moved_first(graph, leaves, dispatch=None):
        if not moves:
            moves.append(ctl.remap(s, island=1))
        return submit(graph, leaves, dispatch)

    ctl.submit = moved_first
    y = f(np.full(8, 5.0, np.float32))
    assert y.result(60).tolist() == [6.0] * 8 and y.island == 0  # where it was traced
    assert moves and s.island.id == 1
    z = f(y)  # traced again, for the slice where it is now
    assert z.result(60).tolist() == [7.0] * 8 and z.island == 1


def test_remap_to_a_full_island_fails_and_keeps_the_mapping(ctl):
    s = ctl.slice(4, island=0)
    with pytest.raises(pw.SliceError):
        ctl.remap(s, island=5)
    assert s.island.id == 0


def test_closed_controller_refuses_use(ctl):
    s = ctl.slice(2)
    ctl.close()
    with pytest.raises(pw.ControllerClosedError, match="closed"):
        ctl.slice(2)
    with pytest.raises(pw.ControllerClosedError):
        _ = s.mesh
    # what only reads or tidies answers as an empty controller (README: ``ctl.close()``)
    assert ctl.snapshot().closed and ctl.status()["closed"]
    assert ctl.runs() == [] and set(ctl.memory().values()) == {0}
    assert ctl.wait() is True and ctl.cancel_all() == 0
    ctl.close()


def test_too_few_host_devices_explains_the_fix():
    jax.devices()  # JAX's backend is up (with the 8 devices of conftest.py), as in a session
    with pytest.raises(pw.DeviceSetupError, match="jax_num_cpu_devices") as e:
        pw.Controller(islands=(8, 8))
    assert "islands that fit in 8: islands=(4, 4)" in str(e.value), e.value


_FEW_IN_XLA_FLAGS = """
import pwkernel as pw
try:
    pw.controller()
except pw.DeviceSetupError as e:
    print(e)
"""


def test_a_device_count_set_in_xla_flags_is_named_as_the_cause():
    """The user's XLA_FLAGS gave JAX 2 CPU devices and the controller (the default islands
    (4, 4)) started JAX itself: the error used to say JAX 'was already initialized' and to
    create the controller before any JAX operation, which is what the user had done."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env.pop("PWKERNEL_ISLANDS", None)
    done = subprocess.run([sys.executable, "-c", _FEW_IN_XLA_FLAGS], capture_output=True,
                          text=True, timeout=300, env=env)
    out = done.stdout
    assert "need 8 CPU devices but XLA_FLAGS=" in out and "gives JAX 2" in out, (out,
                                                                              done.stderr)
    assert "already initialized" not in out, out
    assert "--xla_force_host_platform_device_count=8 in XLA_FLAGS" in out, out
    assert "islands=(1, 1)" in out and "PWKERNEL_ISLANDS=1,1" in out, out


def test_remap_refuses_a_slice_of_another_controller(ctl):
    """It used to move the other controller's slice onto this one's devices, taking load off
    devices this controller never gave it (its counts went negative)."""
    with pytest.warns(pw.SharedDevicesWarning):
        other = pw.Controller(islands=(4, 4))
    try:
        theirs = other.slice(2, island=0)
        with pytest.raises(pw.SliceError, match="remap needs a VirtualSlice of this controller"):
            ctl.remap(theirs, island=1)
        assert theirs.island.id == 0 and theirs.controller is other
        mine = ctl.slice(4, island=1)  # island 1 is still wholly free here
        assert ctl.remap(mine, island=1).island.id == 1
    finally:
        other.close()


def test_a_function_on_a_closed_controllers_slice_says_to_place_it_again():
    """It said "create a new one with pw.Controller(...)" even after the user had: the
    function was still placed on the old controller's slice, which the message did not say."""
    old = pw.Controller(islands=(4, 4))
    double = pw.function(lambda x: x * 2, slice=old.slice(2))
    old.close()
    with pw.Controller(islands=(4, 4)) as new:
        for call in (lambda: double(np.ones(2)), lambda: double.lower(np.ones(2))):
            with pytest.raises(pw.ControllerClosedError,
                               match=r"slice \d+ belongs to a controller that was closed.*"
                                     r"pw.function\(fn, slice=ctl.slice\(\.\.\.\)\)"):
                call()
        assert new.slices == ()


def test_devices_may_be_given_as_jax_devices_as_jax_make_mesh_takes_them(ctl):
    """``jax.make_mesh(..., devices=jax.devices()[4:6])`` takes device objects; ctl.slice
    refused them as not "device ids" and suggested devices=[0, 1], another island's."""
    devices = jax.devices()[4:6]
    s = ctl.slice(2, devices=devices)
    assert s.devices == tuple(devices) and s.island.id == 1
    assert s.mesh.devices.tolist() == jax.make_mesh((2,), ("x",), devices=devices).devices.tolist()
    grid = ctl.slice((2, 2), devices=np.array(jax.devices()[:4]).reshape(2, 2))
    assert grid.device_ids == (0, 1, 2, 3)
    assert ctl.slice(2, devices=np.arange(6, 8)).device_ids == (6, 7)
    with pytest.raises(pw.SliceError, match="must list 2 distinct device ids"):
        ctl.slice(2, devices=[[0], [1]])  # (a TypeError, unhashable list, before)
    with pytest.warns(pw.SharedDevicesWarning):
        small = pw.Controller(islands=(2,))
    with small:
        with pytest.raises(pw.SliceError, match=r"device 4 \(CpuDevice\(id=4\)\) is not one "
                                                r"of this controller's.*devices=\[0, 1\]"):
            small.slice(2, devices=jax.devices()[4:6])


def test_device_ids_that_do_not_exist_are_named(ctl):
    """devices=[0, 99] said the devices "are not all on one island", as though 99 existed."""
    with pytest.raises(pw.SliceError, match=r"device 99 does not exist here; the islands here "
                                            r"are 0: \[0, 1, 2, 3\], 1: \[4, 5, 6, 7\]"):
        ctl.slice(2, devices=[0, 99])
    assert ctl.slices == ()


def test_an_absurd_island_size_on_the_local_backend_is_refused_with_the_limit():
    from pwkernel.backends.local import LocalBackend  # (islands checked as it is made)
    with pytest.raises(pw.DeviceSetupError, match="at most 4096 devices in all") as e:
        LocalBackend(islands=(10**20,))
    assert "incompatible" not in str(e.value)


def test_a_missing_island_or_a_small_one_says_how_to_get_it():
    # (a tutorial written for islands (4, 4), run on a kernel of one island of 8, got "island 1
    # does not exist" and no word of PWKERNEL_ISLANDS, which sets the kernel's islands)
    one = pw.Controller(islands=(8,))
    try:
        with pytest.raises(pw.SliceError, match=r"For 2 islands of these 8 devices: pw\."
                           r"Controller\(islands=\(4, 4\)\), or PWKERNEL_ISLANDS=4,4 for the "
                           r"kernel's pw.controller\(\)"):
            one.slice(2, island=1)
        with pytest.raises(pw.SliceError, match=r"PWKERNEL_ISLANDS=9 for the kernel's"):
            one.slice(9, island=0)
    finally:
        one.close()
