"""Static positions as ``jax.jit`` reads them, beyond what ``test_jax_contract`` covers."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pwkernel as pw


def _same(got, want) -> None:
    got = jax.tree.map(lambda v: v.result(60) if isinstance(v, pw.Future) else v, got)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_negative_static_position_with_star_args_counts_from_each_calls_end(ctl):
    """With ``*args`` a negative static position is taken from the end of each call's
    positional arguments, as jax.jit takes it (it was refused when the function was made);
    a ``@pw.program`` reads it the same way."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)

    def scaled(v, *rest):  # the last positional argument is a Python int (static)
        assert isinstance(rest[-1], int)
        return v * rest[-1] + len(rest)

    f = pw.function(scaled, slice=s, static_argnums=-1)
    jf = jax.jit(scaled, static_argnums=-1)
    for args in ((x, 5), (x, x, 3), (x, x, x, 2)):
        _same(f(*args), jf(*args))
    both = pw.function(lambda *a: a[1] * a[0] * a[-1], slice=s, static_argnums=(0, -1))
    _same(both(2, x, 3), jax.jit(lambda *a: a[1] * a[0] * a[-1], static_argnums=(0, -1))(2, x, 3))

    @pw.program
    def last(v, *rest):
        return f(v, *rest)

    prog = pw.program(last.fn, static_argnums=-1)
    _same(prog(x, 7), jf(x, 7))
    with pytest.raises(TypeError, match="argument 1 is of type str"):
        pw.function(lambda *a: a[0], slice=s, static_argnums=-1)(x, "s", 3)


def test_static_argnums_given_as_a_bool_is_a_position_as_in_jax_jit(ctl):
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)
    f = pw.function(lambda v, n: v * n, slice=s, static_argnums=True)
    _same(f(x, 3), jax.jit(lambda v, n: v * n, static_argnums=True)(x, 3))


def test_positions_given_as_numpy_ints_as_jax_jit_takes_them(ctl):
    """``jax.jit`` reads each position with ``operator.index``, so a NumPy integer (a position
    computed with NumPy) is one; so does ``pw.function`` (``static``, ``donate``, alone or in
    a tuple), and a position that is no integer is refused with the fix."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)

    def scaled(v, n):
        return v * n

    for nums in (np.int64(1), (np.int32(1),), np.array(1)):
        _same(pw.function(scaled, slice=s, static_argnums=nums)(x, 3),
              jax.jit(scaled, static_argnums=nums)(x, 3))
    got, want = jax.numpy.arange(4.0), jax.numpy.arange(4.0)
    _same(pw.function(scaled, slice=s, donate_argnums=np.int64(0))(got, 2.0),
          jax.jit(scaled, donate_argnums=np.int64(0))(want, 2.0))
    assert got.is_deleted() == want.is_deleted()
    with pytest.raises(TypeError, match=r"static_argnums must be ints.*static_argnums=\(1,\)"):
        pw.function(scaled, slice=s, static_argnums=1.0)


def test_a_negative_static_position_past_a_calls_start_is_refused_as_jax_jit_does(ctl):
    """With ``*args``, a negative static position beyond the call's positional arguments is a
    ``ValueError`` under ``jax.jit``; it must not wrap around onto another argument."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)

    def first(*args):
        return args[0] * 2

    with pytest.raises(ValueError):
        jax.jit(first, static_argnums=-3)(x, x)
    f = pw.function(first, slice=s, static_argnums=-3)
    with pytest.raises(ValueError, match=r"static_argnums=-3 .* 2 positional arguments"):
        f(x, x)
    with pytest.raises(ValueError, match=r"static_argnums=-3 .* 2 positional arguments"):
        f.eval_shape(x, x)
    _same(f(1, x, x), jax.jit(first, static_argnums=-3)(1, x, x))  # (in range: static)


def test_a_negative_donated_position_counts_from_the_signatures_end(ctl):
    """``donate_argnums=-1`` donates the last positional parameter (``jax.jit`` 0.10 takes a
    negative one and donates nothing: README); with ``*args`` there is no fixed end, so it
    is refused with the fix, where ``jax.jit`` would silently donate nothing."""
    s = ctl.slice(2)

    def scaled(v, w):
        return v * w

    f = pw.function(scaled, slice=s, donate_argnums=-1)
    v, w = jax.numpy.arange(4.0), jax.numpy.arange(4.0)
    assert [a.donated for a in f.lower(v, w).args_info[0]] == [False, True]
    _same(f(v, w), np.arange(4.0, dtype=np.float32) ** 2)
    assert (v.is_deleted(), w.is_deleted()) == (False, True)
    with pytest.raises(TypeError, match=r"takes \*args; jax.jit takes it there and donates "
                                        r"nothing\); give positions from the start"):
        pw.function(lambda *a: a[0], slice=s, donate_argnums=-1)


def test_a_positional_only_static_argument_gets_no_name(ctl):
    """``static_argnums`` on a positional-only parameter: a call can give it by position only,
    so ``jax.jit`` gives it no name (a keyword of the same name goes into ``**kwargs``,
    dynamic); it was named, and the function's trace refused it (or the keyword went static)."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)

    def scaled(v, n, /, **kw):
        return v * n + sum(kw.values())

    f = pw.function(scaled, slice=s, static_argnums=1)
    jf = jax.jit(scaled, static_argnums=1)
    _same(f(x, 3), jf(x, 3))
    _same(f(x, 3, n=x), jf(x, 3, n=x))  # (the keyword n is **kw's, an array: dynamic)
    _same(jax.grad(lambda v: f(v, 2).sum())(x), jax.grad(lambda v: jf(v, 2).sum())(x))
