"""%%pathways cells as a JAX researcher writes them: state (any pytree of futures) flows from
one cell to the next on the devices, and values are there where Python asks for them."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import pwkernel as pw
from tests.helpers.programs import gate
from tests.helpers.shell import forget_futures, run

SETUP = """
import jax, jax.numpy as jnp, numpy as np, optax
import flax.linen as nn
import pwkernel as pw

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(32)(x)))

model = MLP()
rng = np.random.RandomState(0)
xs = rng.randn(64, 16).astype(np.float32)
ys = (xs[:, :1] * 2 + 1).astype(np.float32)
params = model.init(jax.random.PRNGKey(0), jnp.ones((64, 16)))
tx = optax.adam(1e-2)
opt = tx.init(params)

def loss_fn(p, x, y):
    return jnp.mean((model.apply(p, x) - y) ** 2)
"""

STEP = """%%pathways --slice s
loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
updates, opt = tx.update(grads, opt, params)
params = optax.apply_updates(params, updates)
print(f"step loss {float(loss):.7f}")
"""


@pytest.fixture
def ip(capsys):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pwkernel")
    capsys.readouterr()
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "pwkernel")
        forget_futures(shell)


def _jit_losses(steps: int) -> list[float]:
    """The same training loop in plain jax.jit, from the same seed."""
    ns: dict = {}
    exec(SETUP, ns)  # noqa: S102 - the test's own setup code

    @jax.jit
    def step(params, opt):
        loss, grads = jax.value_and_grad(ns["loss_fn"])(params, ns["xs"], ns["ys"])
        updates, opt = ns["tx"].update(grads, opt, params)
        return ns["optax"].apply_updates(params, updates), opt, loss

    params, opt, out = ns["params"], ns["opt"], []
    for _ in range(steps):
        params, opt, loss = step(params, opt)
        out.append(float(loss))
    return out


def test_flax_optax_trained_one_step_per_cell_matches_a_jit_loop(ip, capsys):
    run(ip, SETUP)
    run(ip, "%pathways slice s 2")
    capsys.readouterr()
    for _ in range(20):
        run(ip, STEP)
    printed = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines()
               if line.startswith("step loss")]
    want = _jit_losses(20)
    assert len(printed) == 20
    np.testing.assert_allclose(printed, want, rtol=2e-5, atol=1e-6)
    assert want[-1] < want[0] / 2  # it trains
    # the state stayed on the devices: a pytree of futures, never copied to the host
    kernel = ip.user_ns["params"]["params"]["Dense_0"]["kernel"]
    mu = ip.user_ns["opt"][0].mu["params"]["Dense_0"]["kernel"]
    assert isinstance(kernel, pw.Future) and isinstance(mu, pw.Future)
    # each cell's program is in the trace, on the slice's devices
    runs = {e.program_id for e in pw.controller().trace.events()
            if e.kind == "compute" and e.program.startswith("cell[")}
    assert len(runs) >= 20


def test_values_on_demand_branching_and_formatting(ip, capsys):
    run(ip, "import jax.numpy as jnp, numpy as np")
    run(ip, "%pathways slice s 2")
    out = run(ip, """%%pathways --slice s
x = jnp.arange(8.0)
total = x.sum()
if total > 10:
    print("big", float(total), total.item(), np.asarray(x)[:2].tolist())
y = x * 2
y.sum()
""")
    text = capsys.readouterr().out
    assert "big 28.0 28.0 [0.0, 1.0]" in text
    assert float(out) == 56.0
    # the array work around the Python that needs values still ran as programs
    assert isinstance(ip.user_ns["y"], pw.Future | jax.Array)
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), np.arange(8.0) * 2)


def test_a_cell_that_starts_a_copy_to_the_host(ip):
    """``y.copy_to_host_async()`` in a cell (a value's method, as ``block_until_ready``): the
    statement runs as plain Python, not traced (before: JAX's "not available on a traced
    array" error)."""
    run(ip, "import jax.numpy as jnp, numpy as np")
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\ny = jnp.arange(4.0) * 3\ny.copy_to_host_async()\n"
            "z = y + 1\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["z"]), np.arange(4.0) * 3 + 1)


def test_a_cell_that_does_arithmetic_on_a_pw_function_result(ip):
    """``double(jnp.sin(x)) + 1``: a compiled function's result used as an array (before: a
    TypeError, Future + int)."""
    run(ip, "import jax.numpy as jnp, numpy as np, pwkernel as pw")
    run(ip, "%pathways slice s 2")
    run(ip, "double = pw.function(lambda v: v * 2, slice=s)")
    run(ip, "%%pathways --slice s\nx = jnp.arange(4.0)\ny = double(jnp.sin(x)) + 1\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), np.sin(np.arange(4.0)) * 2 + 1,
                               rtol=1e-6)


def test_a_plain_cell_reads_a_pw_function_result_with_jax_functions(ip, capsys):
    """``jnp.mean(loss)``, ``loss.mean()`` and ``jax.block_until_ready`` on a compiled
    function's result, outside ``%%pathways`` (before: a ValueError, "Triggering
    __jax_array__() during abstractification is no longer supported", and no wait)."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np, pwkernel as pw")
    run(ip, "%pathways slice s 2")
    run(ip, "sq = pw.function(lambda v: (v - 1.0) ** 2, slice=s)")
    run(ip, "loss = jax.block_until_ready(sq(jnp.arange(4.0)))\n"
            "print(f'{jnp.mean(loss):.2f} {loss.mean():.2f} {jax.jit(jnp.max)(loss):.1f}')")
    assert capsys.readouterr().out.splitlines()[-1] == "1.50 1.50 4.0"


def test_a_loop_that_stops_on_a_value(ip, capsys):
    run(ip, "import jax.numpy as jnp")
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nw = jnp.ones(4) * 8\n")
    run(ip, """%%pathways --slice s
for i in range(10):
    w = w / 2
    if w.sum() < 3:
        break
""")
    assert ip.user_ns["i"] == 3
    np.testing.assert_allclose(np.asarray(ip.user_ns["w"]), 0.5)



def test_a_plain_loop_whose_step_fails_keeps_the_good_state_it_was_told_to(ip):
    """docs/magics.md: a loop that reads a value each step runs as plain Python; a step whose
    computation fails binds its failed futures (as jax.jit's asynchronous dispatch binds
    arrays), the error comes at the read, and a ``good = w`` kept after each read is the
    state of the last step that finished."""
    run(ip, "%pathways slice s 2")
    run(ip, "import jax, jax.numpy as jnp, pwkernel as pw")
    run(ip, "def boom(v):\n    if v > 1.5:\n        raise RuntimeError(f'failed at {v}')\n"
            "def step(w, i):\n    jax.debug.callback(boom, i)\n    return w * 2 + i, w.sum()\n"
            "pstep = pw.function(step, slice=s)\nw = jnp.ones(3)")
    result = ip.run_cell("%%pathways --slice s\nfor i in range(3):\n"
                         "    w, loss = pstep(w, i * 1.0)\n    print(float(loss))\n    good = w\n")
    assert "failed at 2.0" in str(result.error_in_exec), result.error_in_exec
    np.testing.assert_allclose(np.asarray(ip.user_ns["good"]), 5.0)  # 1 -> 2 -> 5
    with pytest.raises(Exception, match="failed at 2.0"):
        ip.user_ns["w"].result()
    run(ip, "%%pathways --slice s\nw, loss = pstep(good, 0.0)\n")  # training goes on
    np.testing.assert_allclose(np.asarray(ip.user_ns["w"]), 10.0)

def test_a_pw_function_called_with_state_from_earlier_cells(ip):
    run(ip, "import jax, jax.numpy as jnp, numpy as np, pwkernel as pw")
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nstate = {'w': jnp.ones((4, 4)), 'b': [jnp.zeros(4)]}\n")
    run(ip, "f = pw.function(lambda st, x: {'w': st['w'] + x, 'b': [st['b'][0] - 1]}, slice=s)")
    run(ip, "%%pathways --slice s\nstate = f(state, 1.0)\n")
    state = ip.user_ns["state"]
    np.testing.assert_allclose(np.asarray(state["w"]), 2.0)
    np.testing.assert_allclose(np.asarray(state["b"][0]), -1.0)


def test_reading_a_name_before_the_cell_assigns_it_is_a_name_error(ip):
    run(ip, "import jax.numpy as jnp")
    run(ip, "%pathways slice s 2")
    with pytest.raises(NameError, match="later_name"):
        run(ip, "%%pathways --slice s\nz = later_name + 1\nlater_name = jnp.ones(2)\n")


def test_users_arrays_given_to_a_cell_are_not_deleted(ip):
    """A user's single-device array read replicated by a cell on a slice holding its device."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np")
    run(ip, "%pathways slice s 4")
    run(ip, "a = jax.device_put(jnp.arange(4.0), s.devices[0])")
    run(ip, "%%pathways --slice s\nb = a * 2\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["b"]), np.arange(4.0) * 2)
    np.testing.assert_allclose(np.asarray(ip.user_ns["a"]), np.arange(4.0))


def test_pytrees_mixing_arrays_and_plain_values(ip):
    """The arrays of a pytree are inputs (their layouts kept, futures included); its plain
    values stay plain Python, as in the cell without the magic."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np")
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nf = jnp.arange(4.0) * 1\n")
    run(ip, "later = (f, 3, 'tag')")
    run(ip, "%%pathways --slice s\nout = later[0] + later[1]\nrep = jnp.ones(later[1])\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["out"]), np.arange(4.0) + 3)
    assert np.asarray(ip.user_ns["rep"]).shape == (3,)  # used as a shape: a Python int


PYTREES = """
import collections, dataclasses, functools, typing
import flax.struct

class NT(typing.NamedTuple):
    w: jax.Array
    b: jax.Array

@functools.partial(jax.tree_util.register_dataclass, data_fields=["a"], meta_fields=["n"])
@dataclasses.dataclass
class DC:
    a: jax.Array
    n: int

@flax.struct.dataclass
class FS:
    w: jax.Array
    tag: str = flax.struct.field(pytree_node=False, default="t")
"""


def test_pytrees_of_every_kind_flow_from_cell_to_cell(ip):
    """A cell binds NamedTuples, registered dataclasses (with meta fields), flax structs,
    OrderedDicts, defaultdicts and int-keyed dicts of arrays; the next cell reads their
    fields and gets the plain cell's values, each container of its own type."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np")
    run(ip, PYTREES)
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nx = jnp.arange(4.0)\nnt = NT(w=x * 2, b=x + 1)\n"
            "dc = DC(a=x * 3, n=5)\nfs = FS(w=x * 4)\n"
            "od = collections.OrderedDict([('z', x), ('a', x * 5)])\n"
            "dd = collections.defaultdict(list, {'q': x * 6})\nik = {2: x, 1: x * 7}\n")
    assert isinstance(ip.user_ns["nt"].w, pw.Future)
    run(ip, "%%pathways --slice s\ny = nt.w + nt.b + dc.a * dc.n + fs.w + od['a'] + dd['q'] "
            "+ ik[1]\nnt2 = nt._replace(w=nt.w * 0)\ndc2 = dataclasses.replace(dc, n=dc.n + 1)\n"
            "fs2 = fs.replace(w=fs.w + 1)\n")
    x = np.arange(4.0)
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), 3 * x + 1 + 15 * x + 22 * x)
    got = run(ip, "(type(nt2).__name__, dc2.n, type(fs2).__name__, fs2.tag, list(od), "
                  "dd.default_factory, list(ik), jax.tree.structure(nt2) == "
                  "jax.tree.structure(NT(x, x)))")
    assert got == ("NT", 6, "FS", "t", ["z", "a"], list, [2, 1], True)
    np.testing.assert_allclose(np.asarray(ip.user_ns["fs2"].w), 4 * x + 1)


def test_dicts_a_cell_binds_keep_the_order_it_made_them_in(ip):
    """JAX rebuilds a dict with its keys sorted; a dict the cell builds keeps the order plain
    Python gives it (nested ones, ones beside plain values, the cell's last value, and in a
    cell that calls compiled functions too), as the cell without the magic binds it, and a
    dict the cell reads is read in its own order (``list(d.values())``)."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np, pwkernel as pw")
    run(ip, "%pathways slice s 2")
    run(ip, "double = pw.function(lambda v: v * 2, slice=s)")
    shown = run(ip, "%%pathways --slice s\nx = jnp.arange(4.0)\n"
                    "metrics = {'loss': x.sum(), 'acc': x.mean(), 'step': 3}\n"
                    "nest = {'b': {'y': x, 'x': x}, 'a': [x, {'z': x, 'c': None}]}\n"
                    "{'zz': x, 'aa': x}\n")
    assert list(shown) == ["zz", "aa"]
    got = run(ip, "list(metrics), list(nest), list(nest['b']), list(nest['a'][1])")
    assert got == (["loss", "acc", "step"], ["b", "a"], ["y", "x"], ["z", "c"])
    assert isinstance(ip.user_ns["metrics"]["acc"], pw.Future)
    np.testing.assert_allclose(np.asarray(ip.user_ns["metrics"]["acc"]), 1.5)
    run(ip, "%%pathways --slice s\nr = {'w': double(x), 'v': double(x) + 1}\n")
    assert list(ip.user_ns["r"]) == ["w", "v"]
    np.testing.assert_allclose(np.asarray(ip.user_ns["r"]["v"]), np.arange(4.0) * 2 + 1)
    # an input's dicts are read in their own order too (values, not only keys)
    run(ip, "held = {'b': jnp.ones(2), 'a': jnp.zeros(2), 'n': 3}")
    run(ip, "%%pathways --slice s\nst = jnp.stack([v for k, v in held.items() if k != 'n'])\n"
            "ks = list(held)\nsame = held\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["st"]), [[1.0, 1.0], [0.0, 0.0]])
    assert ip.user_ns["ks"] == list(ip.user_ns["same"]) == ["b", "a", "n"]


def test_a_dict_whose_keys_do_not_sort_is_held_as_plain_python(ip):
    """A dict mixing key types (``{1: x, 'a': y}``) is plain Python's, though JAX cannot
    flatten it (its keys do not sort): a cell that binds one runs as plain Python, and a cell
    that reads one (holding futures) reads it as the notebook holds it, with the values of
    the cell without the magic, not JAX's "Comparator raised exception"."""
    run(ip, "import jax, jax.numpy as jnp, numpy as np")
    run(ip, "%pathways slice s 2")
    run(ip, "%%pathways --slice s\nx = jnp.arange(4.0)\nmixed = {1: x, 'a': x * 2}\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["mixed"]["a"]), np.arange(4.0) * 2)
    run(ip, "%%pathways --slice s\nf = jnp.arange(4.0) * 3\n")
    run(ip, "held = {None: f, (1, 2): np.ones(4, np.float32)}")
    run(ip, "%%pathways --slice s\ny = held[None] + held[(1, 2)]\n")
    assert isinstance(ip.user_ns["y"], pw.Future)  # (a program on the slice)
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), np.arange(4.0) * 3 + 1)
    run(ip, "%%pathways --slice s\nz = held[None] * 2\nv = float(z[1])\n")
    assert ip.user_ns["v"] == 6.0


def test_a_session_interrupted_and_timed_out_trains_on_from_the_state_before(ip, capsys):
    """A step cell whose host callback raises KeyboardInterrupt, and one cancelled by
    ``--timeout`` while queued behind other work, bind nothing and consume nothing: the next
    step cell trains on from the state before, with the plain ``jax.jit`` loop's losses."""
    run(ip, SETUP)
    run(ip, "%pathways slice s 2")
    run(ip, "def boom(value):\n    raise KeyboardInterrupt\n")
    entered, release = threading.Event(), threading.Event()
    ip.user_ns["blocker"] = pw.function(gate(entered, release, ip.user_ns["s"].mesh),
                                        slice=ip.user_ns["s"], in_specs=pw.BATCH)
    capsys.readouterr()
    run(ip, STEP)
    with pytest.raises(KeyboardInterrupt):
        run(ip, STEP.replace("print(", "jax.debug.callback(boom, loss)\nprint("))
    run(ip, STEP)
    run(ip, "held = blocker(np.ones(2, np.float32))")  # the slice's devices are busy
    assert entered.wait(60)
    with pytest.raises(TimeoutError, match="--timeout 0.2"):
        run(ip, STEP.replace("--slice s", "--slice s --timeout 0.2"))
    release.set()
    run(ip, "held.result(60);")
    run(ip, STEP)
    printed = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines()
               if line.startswith("step loss")]
    np.testing.assert_allclose(printed, _jit_losses(3), rtol=2e-5, atol=1e-6)


def test_reset_out_frees_the_buffers_of_a_future_a_cell_showed(ip):
    """A future a cell showed and the user then deleted holds no device memory after
    ``%reset -f out`` (IPython's flush left ``_`` in its hidden names, holding the future, and
    ``_`` then stopped following the results); the next result is ``_`` again."""
    import gc

    def cell(source: str):
        result = ip.run_cell(source, store_history=True)
        assert result.success, result.error_in_exec or result.error_before_exec
        return result.result

    cell("import jax.numpy as jnp, pwkernel as pw\nctl = pw.controller()")
    cell("%%pathways\nbig = jnp.ones((256, 256))\nbig\n")
    assert sum(ip.user_ns["ctl"].memory().values()) > 0
    cell("del big")
    cell("%reset -f out")
    gc.collect()
    assert sum(ip.user_ns["ctl"].memory().values()) == 0
    cell("41 + 1")
    assert ip.user_ns["_"] == 42
