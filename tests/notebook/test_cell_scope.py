"""A %%pathways cell's top level is a notebook's top level: functions it defines read the
notebook's names when called, ``x += 1``, ``global`` and ``del`` work, values stored into
outside objects are real arrays, and what the cell binds is what plain Python binds."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.notebook import extension
from pwkernel.runtime import compiled
from tests.helpers.shell import run


@pytest.fixture
def nb(ip):
    run(ip, "%pathways slice s 2")
    run(ip, "import functools")
    return ip


def test_functions_a_cell_defines_work_in_later_cells(nb):
    with warnings.catch_warnings():  # a stale name (a future of a closed controller) that
        warnings.simplefilter("ignore")  # the cell only uses as a parameter: no input of it
        other = pw.Controller(islands=(4, 4))
    nb.user_ns["v"] = pw.function(lambda: jnp.ones(2), slice=other.slice(1))()
    nb.user_ns["v"].result(60)
    other.close()
    run(nb, "%%pathways --slice s\nx = jnp.arange(3.0)\n")
    run(nb, "xs = np.ones((4, 3), np.float32)")
    run(nb, "%%pathways --slice s\n"
            "def f(v):\n    return v * x\n"
            "loss_fn = lambda w: jnp.mean((xs @ w) ** 2)\n"
            "class Scale:\n    k = 2.0\n    def __call__(self, v):\n"
            "        return v * x * self.k\n"
            "y = f(2.0) + loss_fn(x)\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["y"]), np.arange(3.0) * 2 + 9.0)
    run(nb, "%%pathways --slice s\nz = f(3.0) + Scale()(1.0)\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["z"]), np.arange(3.0) * 5)
    assert float(run(nb, "loss_fn(jnp.ones(3))")) == 9.0  # plain cell: real values
    run(nb, "x = jnp.ones(3)")  # a function reads the notebook's names when it is called
    np.testing.assert_allclose(np.asarray(run(nb, "f(3.0)")), np.full(3, 3.0))
    assert nb.user_ns["f"].__globals__ is nb.user_ns
    # what a cell defines looks as it does without the magic: its module, the notebook's
    # globals() (get, in) in the cell, global writes by methods and partials
    run(nb, "n = 0\nlr = 0.5")
    run(nb, "%%pathways --slice s\nq = jnp.ones(2)\nclass Ctr:\n    def tick(self):\n"
            "        global n\n        n += 100\ndef add(a, b):\n    global n\n    n += a\n"
            "    return a + b\nadd2 = functools.partial(add, 2)\n"
            "lr_used = globals().get('lr', 0.1)\nseen = 'lr' in globals()\n")
    run(nb, "Ctr().tick()\nadd2(1)")
    assert nb.user_ns["n"] == 102 and nb.user_ns["lr_used"] == 0.5 and nb.user_ns["seen"]
    assert nb.user_ns["Ctr"].__module__ == nb.user_ns["add"].__module__ == "__main__"


def test_augmented_assignment_global_and_del(nb):
    run(nb, "step = 0")
    run(nb, "%%pathways --slice s\nx = jnp.ones(4)\n")
    run(nb, "%%pathways --slice s\nx += 1\nstep += 1\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["x"]), np.full(4, 2.0))
    assert nb.user_ns["step"] == 1
    run(nb, "%%pathways --slice s\nglobal g\ng = x + 1\n"
            "def put():\n    global h5\n    h5 = jnp.ones(2) * 5\nput()\nk = h5 + 1\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["g"]), np.full(4, 3.0))
    np.testing.assert_allclose(np.asarray(nb.user_ns["k"]), np.full(2, 6.0))
    assert isinstance(nb.user_ns["h5"], pw.Future)
    run(nb, "%%pathways --slice s\nz = x + 1\ndel x\nw = jnp.ones(2)\ndel w\n")
    assert "x" not in nb.user_ns and "w" not in nb.user_ns
    np.testing.assert_allclose(np.asarray(nb.user_ns["z"]), np.full(4, 3.0))


def test_values_stored_into_outside_objects_are_arrays(nb):
    run(nb, "losses, metrics = [], {'hist': []}\nclass Box: pass\nbox = Box()")
    run(nb, "%%pathways --slice s\nx = jnp.arange(8.0)\nlosses.append(x.sum())\n"
            "metrics['m'] = x.mean()\nbox.w = x * 3\ny = x + 1\n"
            "metrics['hist'].append(y[0])\n")
    assert [float(v) for v in nb.user_ns["losses"]] == [28.0]
    assert [float(v) for v in nb.user_ns["metrics"]["hist"]] == [1.0]
    assert float(nb.user_ns["metrics"]["m"]) == 3.5
    np.testing.assert_allclose(np.asarray(nb.user_ns["box"].w), np.arange(8.0) * 3)
    np.testing.assert_allclose(np.asarray(nb.user_ns["y"]), np.arange(8.0) + 1)
    # stored by a function, set by a function's global, kept by a closure, a default or a
    # class attribute, or a list grown in place: the cell runs as plain Python instead
    run(nb, "def record(v):\n    losses.append(v)\ndef setg(v):\n    global gg\n"
            "    gg = v * 2\nlst, count = [], 0")
    run(nb, "%%pathways --slice s\nrecord(jnp.ones(2).sum())\nsetg(jnp.ones(2))\n"
            "lst += [jnp.ones(1)]\ncount += 1\n")
    assert [float(v) for v in nb.user_ns["losses"]] == [28.0, 2.0]
    assert nb.user_ns["gg"].tolist() == [2.0, 2.0] and nb.user_ns["count"] == 1
    assert [v.tolist() for v in nb.user_ns["lst"]] == [[1.0]]
    run(nb, "%%pathways --slice s\nq = jnp.ones(2)\nh = (lambda k: lambda v: v * k)(q * 2)\n"
            "def g(v, w=q * 3):\n    return v + w\nclass Cfg:\n    base = q * 4\n")
    run(nb, "%%pathways --slice s\ny2 = h(1.0) + g(1.0) + Cfg.base\n")
    assert np.asarray(nb.user_ns["y2"]).tolist() == [10.0, 10.0]
    run(nb, "%%pathways --slice s\nxs = jnp.ones((4, 3))\n@jax.jit\ndef loss(w):\n"
            "    return jnp.mean((xs @ w - 1.0) ** 2)\nl0 = loss(jnp.zeros(3))\n")
    assert isinstance(nb.user_ns["l0"], pw.Future)  # still one program: loss forgot its trace
    run(nb, "%%pathways --slice s\nl1 = loss(jnp.ones(3))\n")
    assert float(nb.user_ns["l1"]) == 4.0
    for name in ("losses", "lst", "gg", "h", "g", "Cfg", "loss"):
        value = nb.user_ns[name]
        assert not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(
            value if not callable(value) else []))


def test_mixed_results_undefined_last_name_and_device_get(nb):
    run(nb, "step = 3")
    got = run(nb, "%%pathways --slice s\nloss = jnp.ones(2).sum()\nhist = {'loss': loss, "
                  "'step': step}\nloss, step\n")
    assert float(got[0]) == 2.0 and got[1] == 3
    assert nb.user_ns["hist"]["step"] == 3 and float(nb.user_ns["hist"]["loss"]) == 2.0
    with pytest.raises(NameError, match="undefined_thing"):
        run(nb, "%%pathways --slice s\ny = jnp.ones(2)\nundefined_thing\n")
    run(nb, "%%pathways --slice s\nm = jnp.arange(4.0)\nhost = jax.device_get(m)\n")
    assert isinstance(nb.user_ns["host"], np.ndarray)


def test_a_bare_cell_on_a_functions_own_slice_and_its_cell_number(ip):
    """Without --slice, a compiled function's result is used where it lives (no ambient mesh
    of the default slice), and the cell's program is named after the cell's own number."""
    run(ip, "ctl = pw.controller()\ndouble = pw.function(lambda v: v * 2, "
            "slice=ctl.slice(2, island=0))\nx = np.arange(4.0)")
    run(ip, "%%pathways\ny = double(x) + 1\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["y"]), np.arange(4.0) * 2 + 1)
    count = ip.execution_count
    run(ip, "%%pathways\nz = jnp.ones(3) * 2\n")
    assert ip.user_ns["z"].run.name == f"cell[{count}]"


def test_an_error_in_a_cell_with_a_key_is_the_users_error(nb):
    run(nb, "%%pathways --slice s\nkey = jax.random.key(0)\n")
    with pytest.raises(TypeError, match="reshape") as info:
        run(nb, "%%pathways --slice s\ny = jax.random.normal(key, (2,)).reshape(3, 5)\n")
    assert "data type" not in str(info.value)
    key = nb.user_ns["key"]
    assert jax.random.key_data(key.result() if isinstance(key, pw.Future) else key).shape == (2,)


def test_a_deleted_name_is_unbound_for_the_rest_of_the_cell(nb):
    for name in ("b", "m"):  # (the shell is shared: an earlier test may have bound them)
        nb.user_ns.pop(name, None)
    run(nb, "%%pathways --slice s\na = jnp.arange(4.0)\n")
    run(nb, "n = 5")
    for body in ("del a\nb = a + 1\n", "del n\nm = n + 1\n", "del n\ndel n\n"):
        with pytest.raises(NameError, match="name '[an]' is not defined"):
            run(nb, f"%%pathways --slice s\n{body}")
    assert "b" not in nb.user_ns and "m" not in nb.user_ns
    assert float(nb.user_ns["a"][1]) == 1.0 and nb.user_ns["n"] == 5  # nothing bound
    run(nb, "%%pathways --slice s\ndel n\nn = 7\nc = a * n\n")  # bound again: read again
    assert nb.user_ns["n"] == 7 and float(nb.user_ns["c"][1]) == 7.0


def test_a_statement_that_needs_a_value_leaves_the_notebooks_objects_alone(nb, capsys):
    run(nb, "%%pathways --slice s\nw = jnp.ones(3)\nloss = w.sum()\n")
    run(nb, "losses = [loss]\nhistory = losses\nstate = {'w': w, 'step': 0}\n"
            "trainer_state = state")
    capsys.readouterr()
    run(nb, "%%pathways --slice s\nprint(losses[-1], state['w'], float(loss))\n")
    out = capsys.readouterr().out
    assert "3.0 [1. 1. 1.] 3.0" in out and "no array work" not in out
    assert nb.user_ns["losses"] is nb.user_ns["history"]
    assert nb.user_ns["state"] is nb.user_ns["trainer_state"]
    assert isinstance(nb.user_ns["loss"], pw.Future)
    assert isinstance(nb.user_ns["state"]["w"], pw.Future)
    # changed in place by the statement: the notebook's own object, its futures read on demand
    run(nb, "%%pathways --slice s\nhistory.append(float(loss))\nstate['step'] = int(loss)\n")
    assert nb.user_ns["losses"] == nb.user_ns["history"] and len(nb.user_ns["losses"]) == 2
    assert nb.user_ns["trainer_state"]["step"] == 3
    # rebound by the statement: what it bound stays
    run(nb, "%%pathways --slice s\nloss = float(loss)\n")
    assert nb.user_ns["loss"] == 3.0


def test_a_cell_ending_in_a_semicolon_shows_nothing(nb):
    assert run(nb, "%%pathways --slice s\nq = jnp.ones(2)\nq;\n") is None
    assert run(nb, "%%pathways --slice s\nprint(float(q.sum()))\nq;  # quiet\n") is None
    assert run(nb, "%%pathways --slice s\nq\n") is nb.user_ns["q"]
    assert run(nb, "%%pathways --slice s\nr = 1;\nr\n") == 1


def test_an_interrupt_while_the_cells_python_runs_says_what_happened(nb, capsys):
    """Ctrl-C (or the cell's own raise) while the cell's Python is traced: one line that says
    nothing was submitted, without JAX's tracing frames; an undefined last name prints no
    'no array work' note before its NameError."""
    with pytest.raises(KeyboardInterrupt, match=r"cell\[\d+\] interrupted while its Python "
                       "ran; nothing of it was submitted") as info:
        run(nb, "%%pathways --slice s\nq = jnp.ones(2)\nraise KeyboardInterrupt\n")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "q" not in nb.user_ns and extension.state().ctl.runs() == []
    capsys.readouterr()
    with pytest.raises(NameError, match="nosuch_name"):
        run(nb, "%%pathways --slice s\nnosuch_name\n")
    assert "no array work" not in capsys.readouterr().out


def test_a_cell_that_steps_a_flax_nnx_model_runs_it_as_plain_python(nb):
    """nnx Modules and Optimizers change in place: traced in the cell, nnx refused the update
    and left the notebook's model emptied. The cell runs as plain Python instead, and trains
    exactly as the same line without the magic."""
    run(nb, "import optax\nfrom flax import nnx\n"
            "X, Y = np.ones((16, 8), np.float32), np.ones((16, 1), np.float32)\n"
            "@nnx.jit\ndef nnx_step(model, optimizer, x, y):\n"
            "    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)\n"
            "    optimizer.update(model, grads)\n    return loss\n"
            "def fresh():\n    m = nnx.Linear(8, 1, rngs=nnx.Rngs(0))\n"
            "    return m, nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)\n"
            "model, optimizer = fresh()\nplain_model, plain_opt = fresh()")
    for _ in range(3):
        run(nb, "%%pathways --slice s\nloss = nnx_step(model, optimizer, X, Y)\n")
        run(nb, "plain_loss = nnx_step(plain_model, plain_opt, X, Y)")
        assert float(nb.user_ns["loss"]) == float(nb.user_ns["plain_loss"])
    trained, plain = run(nb, "model.kernel[...]"), run(nb, "plain_model.kernel[...]")
    np.testing.assert_array_equal(np.asarray(trained), np.asarray(plain))


def test_an_nnx_model_a_cell_builds_is_the_plain_cells_and_trains_in_later_cells(nb):
    """``model = MLP(rngs=nnx.Rngs(0))`` in a %%pathways cell: bound as a program's output, its
    Variables held futures, and a later plain cell's ``model(X)`` in train mode (BatchNorm's
    running stats, Dropout's rng count: nnx updates them in place) raised "a pw.Future is
    immutable". The cell runs as plain Python, binding the model the plain cell binds; a
    functional ``nnx.split`` state built from it is still a pytree that later cells carry."""
    run(nb, "import optax\nfrom flax import nnx\n"
            "class MLP(nnx.Module):\n    def __init__(self, rngs):\n"
            "        self.l1 = nnx.Linear(4, 8, rngs=rngs)\n"
            "        self.bn = nnx.BatchNorm(8, rngs=rngs)\n"
            "        self.do = nnx.Dropout(0.2, rngs=rngs)\n"
            "        self.l2 = nnx.Linear(8, 1, rngs=rngs)\n"
            "    def __call__(self, x):\n"
            "        return self.l2(self.do(nnx.relu(self.bn(self.l1(x)))))\n"
            "X = np.random.RandomState(0).randn(16, 4).astype(np.float32)\n"
            "plain = MLP(nnx.Rngs(0))\nplain_out = plain(X)")
    run(nb, "%%pathways --slice s\nmodel = MLP(nnx.Rngs(0))\n"
            "optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)\n")
    assert isinstance(nb.user_ns["model"].l1.kernel[...], jax.Array)
    run(nb, "out = model(X)")  # eager, train mode: BatchNorm and Dropout update in place
    np.testing.assert_array_equal(np.asarray(nb.user_ns["out"]),
                                  np.asarray(nb.user_ns["plain_out"]))
    assert int(nb.user_ns["model"].do.rngs.count[...]) == 1
    run(nb, "%%pathways --slice s\ngraphdef, state = nnx.split(MLP(nnx.Rngs(0)))\n")
    assert all(isinstance(x, pw.Future) for x in jax.tree.leaves(nb.user_ns["state"]))


def test_a_cell_run_again_compiles_nothing_new_and_sees_a_changed_value(nb):
    """The same cell run again reuses its executable (runtime/compiled.py); a value its
    Python reads that changed makes a new computation, as it must."""
    compiled.clear()
    run(nb, "w = np.ones(4, np.float32)\nlr = 0.5")
    body = "%%pathways --slice s\nw2 = w - lr * jnp.tanh(w)\n"
    run(nb, body)
    first = compiled.kept()
    run(nb, body)
    assert first >= 1 and compiled.kept() == first
    np.testing.assert_allclose(np.asarray(nb.user_ns["w2"]), 1 - 0.5 * np.tanh(1.0), rtol=1e-6)
    run(nb, "lr = 0.25")  # a value the cell's Python reads: a new computation
    run(nb, body)
    np.testing.assert_allclose(np.asarray(nb.user_ns["w2"]), 1 - 0.25 * np.tanh(1.0), rtol=1e-6)


def test_objects_a_cell_binds_hold_arrays_not_traced_values(nb):
    """A plain object (not a pytree) holding an array, an iterator, a ``map`` or a generator
    over the cell's arrays: used in a later cell, each gives what it gives without the
    magic (the cell runs as plain Python), never a value of the cell's trace."""
    run(nb, "import types, dataclasses\n@dataclasses.dataclass\nclass Box:\n    w: object")
    run(nb, "%%pathways --slice s\nx = jnp.arange(4.0)\nlst = [x, x + 1]\n")
    run(nb, "%%pathways --slice s\nns = types.SimpleNamespace(w=x * 2)\nbx = Box(x * 3)\n"
            "it = iter(lst)\nmp = map(lambda v: v * 4, lst)\ngen = (v * 5 for v in lst)\n"
            "y = x + 1\n")
    got = run(nb, "[np.asarray(v).tolist() for v in (ns.w, bx.w, next(it), next(mp), "
                  "next(gen), y)]")
    assert got == [[k * v for v in range(4)] for k in (2, 3, 1, 4, 5)] + [[1.0, 2.0, 3.0, 4.0]]
    run(nb, "%%pathways --slice s\nparams = {'w': x * 2}\ncfg = types.SimpleNamespace(lr=0.1)\n")
    assert isinstance(nb.user_ns["params"]["w"], pw.Future)  # still one program
    assert nb.user_ns["cfg"].lr == 0.1


def test_a_cell_reading_an_arrays_sharding_runs_as_plain_python(nb):
    """``x.sharding`` (and the other attributes only concrete arrays have: JAX raises
    AttributeError for them on a traced array) is what the same cell gives without the
    magic, under the slice's mesh."""
    run(nb, "%%pathways --slice s\nx = jax.device_put(jnp.arange(4.0), jax.P('x'))\n")
    run(nb, "%%pathways --slice s\ny = x * 2\nsh = y.sharding\nrep = x.is_fully_replicated\n"
            "fmt = x.format\n")
    sharding = nb.user_ns["sh"]
    assert isinstance(sharding, jax.sharding.NamedSharding) and sharding.spec == jax.P("x")
    assert nb.user_ns["rep"] is False and nb.user_ns["fmt"] is not None
    assert np.asarray(nb.user_ns["y"]).tolist() == [0.0, 2.0, 4.0, 6.0]
