"""Plain JAX functions with no sharding annotations, and the inputs they are called on.

The table ``CASES`` is shared by ``tests/runtime/test_jit_conformance.py`` (each function
through ``jax.jit`` under ``jax.set_mesh`` and through ``pw.function``) and the notebook
``tests/notebook/jit_conformance.ipynb`` (each function called in a ``%%pathways`` cell), which
runs this file's text as one of its cells: keep it self-contained (JAX, NumPy, flax, optax only).

A case's ``args`` and ``kwargs`` name inputs of ``inputs()`` (a ``str``) or are Python values
passed as they are (static arguments, a Python float).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class State(NamedTuple):
    w: Any
    step: Any


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(nn.Dense(16)(x)))


MODEL = MLP()


class Dropped(nnx.Module):
    """An nnx model whose state holds its dropout's random stream: a typed key and a count."""

    def __init__(self, rngs: nnx.Rngs):
        self.linear, self.dropout = nnx.Linear(8, 4, rngs=rngs), nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.linear(x))


@functools.cache
def dropped() -> tuple:
    """``nnx.split`` of a ``Dropped`` (made on first use: importing this file starts no JAX
    backend): its graph and its state."""
    return nnx.split(Dropped(nnx.Rngs(0)))
OPTIMIZER = optax.sgd(1e-2, momentum=0.9)


def inputs() -> dict[str, Any]:
    """Host (NumPy) inputs, the same on every call."""
    rng = np.random.default_rng(0)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x = normal(8, 8)
    params = {"w1": normal(8, 16), "b1": normal(16), "w2": normal(16, 4), "b2": normal(4)}
    shapes = jax.eval_shape(MODEL.init, jax.ShapeDtypeStruct((2,), jnp.uint32), x)
    return {
        "x": x, "v": normal(8), "y": normal(8, 4), "params": params,
        "i": rng.integers(0, 8, size=8).astype(np.int32),
        "i8": np.arange(8, dtype=np.int8),
        "tree": {"a": x, "b": normal(8, 8)},
        "pair": (x, normal(8)),
        "state": State(normal(8), np.int32(3)),
        "key": np.asarray(jax.random.PRNGKey(42)),  # a legacy key: uint32[2]
        "typed_key": jax.random.key(42),  # a typed key (key<fry>[]): a jax.Array, not NumPy
        "variables": jax.tree.map(lambda s: normal(*s.shape), shapes),
        "opt_state": jax.tree.map(np.asarray, OPTIMIZER.init(params)),
        "nnx_state": dropped()[1],  # jax.Arrays, a typed key among them
    }


# --- the functions --------------------------------------------------------------------------
def gram(x):
    return x @ x.T


def gram_t(x):
    return x.T @ x


def tanh_chain(x):
    return jnp.tanh(x @ x.T) @ x


def mlp(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def grads(params, x, y):
    return jax.grad(mse)(params, x, y)


def loss_and_grads(params, x, y):
    return jax.value_and_grad(mse)(params, x, y)


def running_sum(x):
    def step(carry, row):
        carry = carry + row
        return carry, carry * 2
    return jax.lax.scan(step, jnp.zeros(x.shape[1], x.dtype), x)


def power_iteration(x):
    return jax.lax.fori_loop(0, 5, lambda _, a: jnp.tanh(x @ a), jnp.ones(x.shape[1], x.dtype))


def first_row(x):
    return x[0]


def second_column(x):
    return x[:, 1]


def even_rows(x):
    return x[::2]


def concatenated(x):
    return jnp.concatenate([x, 2 * x], axis=0)


def stacked(v):
    return jnp.stack([v, v + 1, v * v])


def cumsum0(x):
    return jnp.cumsum(x, axis=0)


def sorted0(x):
    return jnp.sort(x, axis=0), jnp.argsort(x, axis=0)


def reductions(x):  # scalars, and one over an axis
    return jnp.sum(x), jnp.max(x), jnp.mean(x, axis=0)


def reshaped(x):
    return x.reshape(4, 16)


def transposed(x):
    return x.reshape(2, 4, 8).transpose(1, 2, 0)


def rectified(x):
    return jnp.where(x > 0, x, 0.1 * x)


def noisy(key, x):
    return x + jax.random.normal(key, x.shape)


def split_and_draw(key, x):  # a typed key in and out, as a training loop carries its own
    key, sub = jax.random.split(key)
    return key, x + jax.random.normal(sub, x.shape)


def dict_in_out(tree):
    return {"sum": tree["a"] + tree["b"], "prod": tree["a"] * tree["b"], "n": tree["a"].sum()}


def tuple_in_out(pair):
    a, b = pair
    return a @ b, (b * 2, a.T)


def namedtuple_in_out(state):
    return State(state.w - 0.1 * state.step, state.step + 1)


def power(x, n):  # n static (a Python int the function loops over)
    out = x
    for _ in range(n - 1):
        out = out * x
    return out


def shaped(x, shape):  # shape static, by name
    return x.reshape(shape)


def affine(x, *, scale, bias):  # keyword arguments (arrays)
    return x * scale + bias


def scaled(x, s):  # s a Python float
    return x * s


def scaled_bf16(x, s):  # a Python float is weakly typed: the result stays bfloat16
    return x.astype(jnp.bfloat16) * s


def int8_plus(a, n):  # a Python int is weakly typed: the result stays int8
    return a + n


def doubled_scalar(s):  # a weakly typed result, from a Python float
    return s * 2


def gathered(x, i):
    return x[i], (i * 3) % 5


def positive(x):
    return x > 0, jnp.all(x > -10)


def flax_apply(variables, x):
    return MODEL.apply(variables, x)


def nnx_dropout(state, x):  # flax nnx: merge, call, and the state after (its key moved on)
    model = nnx.merge(dropped()[0], state)
    return model(x), nnx.state(model)


def optax_step(params, opt_state, x, y):
    loss, g = jax.value_and_grad(mse)(params, x, y)
    updates, opt_state = OPTIMIZER.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@dataclasses.dataclass(frozen=True)
class Case:
    fn: Callable
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.fn.__name__

    def call(self, values: dict[str, Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with input names replaced by ``values[name]``."""
        def get(a):
            return values[a] if isinstance(a, str) else a
        return tuple(map(get, self.args)), {k: get(a) for k, a in self.kwargs.items()}

    def source(self) -> str:
        """The call as code: ``power(x, 3)``."""
        shown = [a if isinstance(a, str) else repr(a) for a in self.args]
        shown += [f"{k}={a if isinstance(a, str) else repr(a)}" for k, a in self.kwargs.items()]
        return f"{self.name}({', '.join(shown)})"

    def jit_source(self) -> str:
        """The same call through ``jax.jit``: ``jax.jit(power, static_argnums=(1,))(x, 3)``."""
        opts = "".join(f", {k}={getattr(self, k)!r}" for k in ("static_argnums",
                                                              "static_argnames")
                       if getattr(self, k))
        return f"jax.jit({self.name}{opts})" + self.source()[len(self.name):]


CASES = [
    Case(gram, ("x",)),
    Case(gram_t, ("x",)),
    Case(tanh_chain, ("x",)),
    Case(mlp, ("params", "x")),
    Case(mse, ("params", "x", "y")),
    Case(grads, ("params", "x", "y")),
    Case(loss_and_grads, ("params", "x", "y")),
    Case(running_sum, ("x",)),
    Case(power_iteration, ("x",)),
    Case(first_row, ("x",)),
    Case(second_column, ("x",)),
    Case(even_rows, ("x",)),
    Case(concatenated, ("x",)),
    Case(stacked, ("v",)),
    Case(cumsum0, ("x",)),
    Case(sorted0, ("x",)),
    Case(reductions, ("x",)),
    Case(reshaped, ("x",)),
    Case(transposed, ("x",)),
    Case(rectified, ("x",)),
    Case(noisy, ("key", "x")),
    Case(split_and_draw, ("typed_key", "x")),
    Case(dict_in_out, ("tree",)),
    Case(tuple_in_out, ("pair",)),
    Case(namedtuple_in_out, ("state",)),
    Case(power, ("x", 3), static_argnums=(1,)),
    Case(shaped, ("x",), {"shape": (2, 32)}, static_argnames=("shape",)),
    Case(affine, ("x",), {"scale": "v", "bias": "v"}),
    Case(scaled, ("x", 2.5)),
    Case(scaled_bf16, ("x", 2.5)),
    Case(int8_plus, ("i8", 3)),
    Case(doubled_scalar, (2.5,)),
    Case(gathered, ("x", "i")),
    Case(positive, ("x",)),
    Case(flax_apply, ("variables", "x")),
    Case(optax_step, ("params", "opt_state", "x", "y")),
    Case(nnx_dropout, ("nnx_state", "x")),
]
