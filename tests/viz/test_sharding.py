"""The sharding picture: blocks and device labels from known layouts, and its HTML."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pwkernel.viz import sharding as pic


def _mesh(shape, names):
    devices = np.array(jax.devices()[:int(np.prod(shape))], dtype=object).reshape(shape)
    return jax.sharding.Mesh(devices, names)


def test_a_2d_layout_has_one_block_per_device_in_mesh_order():
    sh = NamedSharding(_mesh((4, 2), ("x", "y")), P("x", "y"))
    found = pic.blocks((8, 4), sh)
    assert len(found) == 8 and {b.shape for b in found} == {(2, 2)}
    # Row-major over the mesh: device 2k holds rows 2k..2k+2, columns 0..2; 2k+1 the rest.
    assert found[0] == pic.Block(((0, 2), (0, 2)), (0,))
    assert found[1] == pic.Block(((0, 2), (2, 4)), (1,))
    assert found[-1] == pic.Block(((6, 8), (2, 4)), (7,))


def test_replicated_axes_group_devices_on_one_block():
    mesh = _mesh((4, 2), ("x", "y"))
    found = pic.blocks((8, 4), NamedSharding(mesh, P("x")))
    assert [b.devices for b in found] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [b.index for b in found][1] == ((2, 4), (0, 4))
    (whole,) = pic.blocks((8, 4), NamedSharding(mesh, P()))
    assert whole.devices == tuple(range(8)) and whole.index == ((0, 8), (0, 4))
    assert pic.summary((8, 4), NamedSharding(mesh, P("x"))) == "4 blocks of 2x4, each on 2 devices"


def test_labels_name_island_and_device():
    block = pic.Block(((0, 2),), (4, 5))
    assert pic.block_label(block, {4: 1, 5: 1}) == "i1:d4 i1:d5"
    assert pic.block_label(block) == "d4 d5"
    assert pic.device_color(4) != pic.device_color(5)


def _cells(page: str) -> list[str]:
    return re.findall(r'<div title="([^"]*)"', page)


def test_html_draws_a_grid_for_2d_and_a_strip_for_1d():
    mesh = _mesh((4, 2), ("x", "y"))
    page = pic.sharding_html((8, 4), NamedSharding(mesh, P("y", "x")),
                             island_of={d: d // 4 for d in range(8)})
    assert "display:grid" in page and "P(&#x27;y&#x27;, &#x27;x&#x27;)" in page
    cells = _cells(page)
    assert len(cells) == 8 and "[0:4, 0:1] on i0:d0" in cells
    assert "[4:8, 3:4] on i1:d7" in cells  # device 7 (island 1) holds the last block
    assert "grid-template-columns:1fr 1fr 1fr 1fr" in page
    strip = pic.sharding_html((8,), NamedSharding(mesh, P("x")))
    assert len(_cells(strip)) == 4 and "[2:4] on d2 d3" in _cells(strip)


def test_higher_ranks_are_summarised_as_a_list_of_blocks():
    mesh = _mesh((4, 2), ("x", "y"))
    page = pic.sharding_html((4, 2, 3), NamedSharding(mesh, P("x", "y")))
    assert "display:grid" not in page and "8 blocks of 1x1x3, each on 1 device" in page
    assert page.count("<tr>") == 1 + 8 and "[3:4, 1:2, 0:3]" in page
    more = pic.blocks((4, 2, 2), NamedSharding(mesh, P("x", "y"))) * 3  # 24 > MAX_ROWS
    listing = pic._listing(more, None)
    assert listing.count("<tr>") == 1 + pic.MAX_ROWS + 1 and f"... {24 - pic.MAX_ROWS} more" \
        in listing


@pytest.mark.parametrize("shape", [(), (0, 4)])
def test_scalars_and_empty_arrays_still_draw(shape):
    sh = NamedSharding(_mesh((2,), ("x",)), P())
    page = pic.sharding_html(shape, sh)
    assert "1 block" in page
