"""A trainer given the wrong slices or key says so when it is made, naming the fix."""

from __future__ import annotations

import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer

CFG = transformer.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
KW = dict(loss=transformer.cross_entropy, optimizer=optax.adam(1e-2))


def test_a_pipeline_takes_a_list_of_slices_of_one_controller(tctl):
    stages = transformer.split(CFG, 2)
    s0 = tctl.slice(1, island=0)
    # (one slice was "object of type 'VirtualSlice' has no len()")
    with pytest.raises(TypeError, match=r"slices must be a list of VirtualSlices, one per "
                                        r"stage \(2 here\), got one VirtualSlice.*"
                                        r"pw.train.SPMD\(stages, slice"):
        pw.train.Pipeline(stages, s0, **KW)
    # (these failed only in init, as pw.function's or a program's error)
    with pytest.raises(TypeError, match=r"slices must be VirtualSlices \(from ctl.slice"
                                        r"\(...\)\), one per stage, got \['str', 'str'\]"):
        pw.train.Pipeline(stages, ["a", "b"], **KW)
    with pytest.raises(TypeError, match=r"one per stage \(2 here\), got int 2\. Maybe you "
                                        r"want slices=\[ctl.slice\(1\) for _ in range\(2\)\]"):
        pw.train.Pipeline(stages, 2, **KW)  # (was "'int' object is not iterable")
    other = pw.Controller(islands=(2,))
    try:
        with pytest.raises(ValueError, match=r"slices of one controller.*stage 1's is on "
                                             r"another.*stage 0's controller, ctl.slice\(1\)"):
            pw.train.Pipeline(stages, [s0, other.slice(1)], **KW)
    finally:
        other.close()


def test_spmd_takes_one_slice(tctl):
    stages = transformer.split(CFG, 2)
    slices = [tctl.slice(1, island=0), tctl.slice(1, island=1)]
    # (a list was accepted, then refused by pw.function in init)
    with pytest.raises(TypeError, match=r"SPMD trains on one slice \(a VirtualSlice from "
                                        r"ctl.slice\(...\)\), got list.*pw.train.Pipeline"):
        pw.train.SPMD(stages, slices, **KW)


@pytest.mark.parametrize("key", ["0", 0.5, None])
def test_init_says_what_a_key_is(tctl, key):
    pipe = pw.train.Pipeline(transformer.split(CFG, 2),
                             [tctl.slice(1, island=0), tctl.slice(1, island=1)], **KW)
    # (JAX's "invalid PRNG key data: expected key_data.ndim >= 1; got ndim=0")
    with pytest.raises(TypeError, match=r"key must be an int seed or a JAX PRNG key "
                                        r"\(jax.random.key\(0\) or jax.random.PRNGKey\(0\)\), "
                                        r"got (str|float|NoneType).*init\(0\)"):
        pipe.init(key)


def test_a_misspelt_trainer_keyword_names_the_one_meant(tctl):
    # (Python's bare "got an unexpected keyword argument 'optimiser'" named no right word)
    stages, s = transformer.split(CFG, 1), tctl.slice(1)
    with pytest.raises(TypeError, match=r"pw.train.SPMD\(\) got an unexpected keyword argument "
                                        r"'optimiser'\. Did you mean optimizer=\? "
                                        r"pw.train.SPMD\(\) takes: stages, slice, loss, "
                                        r"optimizer,"):
        pw.train.SPMD(stages, s, loss=transformer.cross_entropy, optimiser=optax.adam(1e-2))
    with pytest.raises(TypeError, match=r"pw.train.Pipeline\(\) got .* 'microbatch'\. Did you "
                                        r"mean microbatches=\?"):
        pw.train.Pipeline(stages, [s], microbatch=2, **KW)
    with pytest.raises(TypeError, match=r"pw.train.MemorySampler\(\) got .* 'intervall'\. Did "
                                        r"you mean interval=\?"):
        pw.train.MemorySampler(tctl, intervall=1.0)


@pytest.mark.parametrize("trainer", ["pipeline", "spmd"])
@pytest.mark.parametrize("loss", [None, 3])
def test_a_trainer_refuses_a_loss_that_is_not_a_function_when_made(tctl, trainer, loss):
    stages, s = transformer.split(CFG, 1), tctl.slice(1)
    # (accepted, then step failed tracing: "'NoneType' object is not callable", or for a
    # pipeline's None JAX's "unexpected JAX type ... float0" from the backward pass)
    with pytest.raises(TypeError, match=r"loss must be a function loss\(outputs, targets\) -> "
                                        r"a scalar, got (NoneType|int).*e\.g\. loss=lambda"):
        if trainer == "pipeline":
            pw.train.Pipeline(stages, [s], loss=loss, optimizer=optax.adam(1e-2))
        else:
            pw.train.SPMD(stages, s, loss=loss, optimizer=optax.adam(1e-2))


def test_stages_are_a_list_of_stages_with_functions(tctl):
    stage, s = transformer.split(CFG, 1)[0], tctl.slice(1)
    # (one Stage was Python's "'Stage' object is not iterable")
    with pytest.raises(TypeError, match=r"stages must be a non-empty list of pw.train.Stage"
                                        r"\(init, apply\), got one Stage\. Maybe you want "
                                        r"stages=\[stage\]"):
        pw.train.Pipeline(stage, [s], **KW)
    # (accepted, then init or step failed tracing: "'int' object is not callable")
    with pytest.raises(TypeError, match=r"stage 0's init must be a function init\(key\) -> "
                                        r"params, got int 3"):
        pw.train.SPMD([pw.train.Stage(init=3, apply=stage.apply)], s, **KW)
    with pytest.raises(TypeError, match=r"stage 1's apply must be a function apply\(params, "
                                        r"x\) -> y, got NoneType None"):
        pw.train.Pipeline([stage, pw.train.Stage(init=stage.init, apply=None)],
                          [s, tctl.slice(1)], **KW)
