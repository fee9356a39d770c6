"""A preset's name with islands of chip counts (``pw.Controller(backend="sim", cluster=NAME,
islands=...)``): what it builds, and what it refuses with the fix."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends import sim


def test_gpu_preset_islands_may_differ_and_copy_between_them():
    """GPU nodes hang off a switch, so islands of different sizes are the same model (before,
    every preset refused them: "the simulated islands of a preset are equal")."""
    with pw.Controller(backend="sim", cluster="h100", islands=(16, 8)) as ctl:
        assert [len(i.devices) for i in ctl.islands] == [16, 8]
        assert ctl.executor.cluster.islands == (2, 1)  # hosts of 8 GPUs
        assert ctl.executor.cluster.chip.name == "H100 SXM"
        double = pw.function(lambda x: x * 2, slice=ctl.slice(16, island=0))
        total = pw.function(lambda x: x.sum(), slice=ctl.slice(8, island=1))
        out = total(double(np.ones(1024, np.float32)))
        assert out.wait(timeout=30) and out.shape == ()
        kinds = {e.kind for e in ctl.trace.events()}
        assert "transfer" in kinds  # the copy over DCN between the islands


def test_tpu_preset_islands_are_equal_and_the_error_says_why():
    with pytest.raises(sim.SimError, match=r"islands of a TPU preset are equal \(one torus "
                       r"shape for every island\); islands=\(8, 4\) are not. Maybe you want "
                       r"islands=\(8, 8\)"):
        pw.Controller(backend="sim", cluster="tpu-v4", islands=(8, 4))


def test_unequal_islands_of_part_hosts_name_whole_hosts():
    with pytest.raises(sim.SimError, match=r"whole hosts of 8 chips; islands=\(16, 4\) are "
                       r"not. Maybe you want islands=\(16, 8\)"):
        pw.Controller(backend="sim", cluster="h100", islands=(16, 4))


def test_islands_as_one_number_suggests_one_island_of_that_many():
    """``islands=16`` meant one island of 16 chips: the fix says ``islands=(16,)`` (it said
    ``islands=(4, 4)``, which an H100 preset then refuses: 4 is not whole nodes)."""
    with pytest.raises(pw.DeviceSetupError, match=r"got 16. Maybe you want islands=\(16,\)"):
        pw.Controller(backend="sim", cluster="h100", islands=16)


@pytest.mark.parametrize(("preset", "ask", "fix"), [("h100", 12, 16), ("tpu-v4", 10, 12)])
def test_a_slice_too_large_names_this_preset_and_whole_hosts(preset, ask, fix):
    """The fix for a slice larger than every island names the cluster's own preset and an
    island of whole hosts (it said cluster='tpu-v4', islands=(12,) on an H100 cluster,
    which the preset then refuses: 12 GPUs are not whole nodes of 8)."""
    with pw.Controller(backend="sim", cluster=preset, islands=(8,)) as ctl:
        with pytest.raises(pw.SliceError, match=rf"cluster='{preset}', islands=\({fix},\)\)"):
            ctl.slice(ask)
    with pw.Controller(backend="sim", cluster=preset, islands=(fix,)) as ctl:
        assert len(ctl.slice(ask).devices) == ask  # the fix works
