"""Stage parameters that jax.grad cannot differentiate (an int step counter, a PRNG key kept
beside the weights): plain jax.jit refuses them, and so does every trainer, with an error
that names the stage, the leaf and what to pass instead (before, a Pipeline failed in
``s0.bwd[m0]``'s trace with "Called add with a float0 array" or "Cannot convert_element_type
from key<fry> to void")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw

X = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
Y = np.sin(X[:, :1])
EXTRA = {"int": lambda: jnp.int32(0), "key": lambda: jax.random.key(1)}


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def stages(extra):
    return [pw.train.Stage(lambda k: {"w": jax.random.normal(k, (4, 8)) / 2},
                           lambda p, h: jnp.tanh(h @ p["w"])),
            pw.train.Stage(lambda k: {"w": jax.random.normal(k, (8, 1)) / 3, "n": extra()},
                           lambda p, h: h @ p["w"])]




@pytest.mark.parametrize("extra", sorted(EXTRA))
@pytest.mark.parametrize("kind", ["pipeline", "spmd", "spmd-packed"])
def test_a_parameter_jax_grad_cannot_take_is_refused_naming_the_leaf(tctl, kind, extra):
    model, opt = stages(EXTRA[extra]), optax.adam(1e-2)
    params = [st.init(k) for st, k in zip(model, jax.random.split(jax.random.key(0), 2),
                                          strict=True)]
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        jax.jit(jax.grad(lambda ps: mse(model[1].apply(ps[1], model[0].apply(ps[0], X)),
                                        Y)))(params)  # plain JAX refuses it too
    if kind == "pipeline":
        t = pw.train.Pipeline(model, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                              loss=mse, optimizer=opt, microbatches=2, name=f"p{extra}")
    else:
        t = pw.train.SPMD(model, tctl.slice(2, island=0), loss=mse, optimizer=opt,
                          packed=kind == "spmd-packed", name=f"{kind}{extra}")
    state = t.init(0)
    with pytest.raises(TypeError, match=r"stage 1's parameters hold \['n'\], an? .*, which "
                       r"jax\.grad cannot differentiate.*nnx\.Param"):
        t.step(state, (X, Y))
    assert np.isfinite(float(t.evaluate(state, (X, Y))))  # the state is still the user's
