"""A value that arrives later, taken wherever JAX takes an array: ``ArrayOnDemand``, the base
of ``pw.Future``. Each of the following is the value's own, as after ``jax.jit``; a JAX
operation (arithmetic, a comparison, indexing, a method that gives an array, a ``jnp``
function, ``jax.jit``) computes on ``array()``, which a ``Future`` whose computation is
launched gives at once, the array being computed, as JAX dispatches an operation on an array
not ready yet (``total = total + loss`` does not wait for the step); what gives a Python or
host value (``float``, ``bool``, ``.item()``, ``np.asarray``, ``str``, an f-string, ``pickle``)
waits for the value (``result()``), as JAX's do:

- Python's operators, indexing, iteration and conversions (``f(x) + 1``, ``fut[0]``,
  ``float(loss)``, ``np.asarray(fut)``, ``x[fut]`` (``_index_with``: JAX's indexing parses an
  index by its type), ``str``, ``print`` and f-strings (``repr`` is the
  future's own: its name, shape and state, without waiting; a simulated future, which has no
  value, prints that too);
- the ``jax.Array`` methods in ``ARRAY_METHODS`` and properties in ``ARRAY_PROPERTIES``
  (``loss.mean()``, ``w.T``, ``x.astype(jnp.bfloat16)``, ``x.at[0].set(1)``), DLPack's and the
  array API's among them (``np.from_dlpack(fut)``, ``fut.device``);
- JAX's own functions and transformations: ``jnp.sum(fut)``, ``jax.jit(g)(fut)``,
  ``jax.grad(loss)(params)`` with futures in ``params``. JAX no longer calls ``__jax_array__``
  where it abstracts an argument ("Triggering __jax_array__() during abstractification is no
  longer supported"), so the class is registered with JAX's type of a value and its argument
  canonicalization (``register_with_jax``): both take the value the future holds;
- ``pickle``, ``copy.copy`` and ``copy.deepcopy``: as the array it holds;
- ``block_until_ready()``: waits and returns the future, so ``jax.block_until_ready(tree)``
  waits for the futures in ``tree`` as for arrays (before, it returned at once).

What the future knows before its value (shape, dtype, sharding, ``aval``, ``ndim``, ``size``,
``len()``, ``devices()``, ``nbytes``, ``itemsize``, ``is_fully_replicated``) does not wait,
so a simulated future, which has no value, answers them too. ``==`` and ``hash`` stay the
future's own against another future (or ``None``): a future is a key in dictionaries and
sets, which an array cannot be; against a number or a NumPy value, they compare the value, as
the array does (``loss == 0.5``; before, identity made it False whatever the loss). A future
is not an instance of ``jax.Array`` (a plain class, which takes no virtual subclasses): code
that checks for one (``jax.random`` with a typed key, ``flax.serialization``) needs
``result()``: ``jax.random`` given a key future says so (its check of a non-array key reads
``ndim``, which raises that fix there), and ``jax.device_get`` copies one to the host as it
copies the key (``__array__`` answers it so; ``np.asarray`` raises as for the key). Like the
array, it is immutable: ``fut[i] = v`` raises the TypeError ``jax.Array`` raises, and says what a
flax.nnx module holding futures needs; ``shape``, ``dtype`` and ``sharding`` are read-only
(``read_only``), where NumPy's ``a.shape = ...`` would reshape.
"""

from __future__ import annotations

import copy
import inspect
import numbers
import operator
from collections.abc import Callable

import numpy as np

from .errors import NoValueError

# jax.Array's methods a future answers on its value (``delete`` and ``is_ready`` are not among
# them: the runtime asks values whether they have them).
ARRAY_METHODS = (
    "all", "any", "argmax", "argmin", "argsort", "astype", "choose", "clip", "compress", "conj",
    "conjugate", "copy", "cumprod", "cumsum", "diagonal", "dot", "flatten", "max", "mean",
    "min", "nonzero", "prod", "ptp", "ravel", "repeat", "reshape", "round", "searchsorted",
    "sort", "squeeze", "std", "sum", "swapaxes", "take", "trace", "transpose", "var", "view",
    "addressable_data", "copy_to_host_async", "to_device", "item", "tolist", "argpartition",
    "tobytes", "on_device_size_in_bytes", "unsafe_buffer_pointer", "__dlpack__",
    "__dlpack_device__", "__array_namespace__",
)
ARRAY_PROPERTIES = ("T", "mT", "real", "imag", "at", "flat", "addressable_shards",
                    "global_shards", "is_fully_replicated", "is_fully_addressable", "nbytes",
                    "itemsize", "committed", "format", "device")
_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_",
           "xor", "lshift", "rshift", "divmod")
_UNARY = (("neg", operator.neg), ("pos", operator.pos), ("abs", abs), ("invert", operator.invert),
          ("getitem", operator.getitem), ("iter", iter), ("lt", operator.lt),
          ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge))
_TO_PYTHON = (("float", float), ("int", int), ("complex", complex), ("bool", bool),
              ("index", operator.index), ("round", round))  # Python values: they wait
# the methods that give host or Python values, or the buffer itself: they wait, as JAX's do
_ON_VALUE = ("item", "tolist", "tobytes", "unsafe_buffer_pointer", "__dlpack__",
             "__dlpack_device__", "on_device_size_in_bytes")


# What ``==`` and ``!=`` compare a future's value with (a jax.Array compares a future by its
# own reflected operator): numbers and NumPy values; others (futures, None) by identity.
_COMPARED = (numbers.Number, np.ndarray, np.generic)


def on_value(op: Callable) -> Callable:
    """A method that applies ``op`` to the value (waiting for it), as a ``jax.Array`` would."""
    def method(self, *args, **kwargs):
        return op(self.result(), *args, **kwargs)
    method.__name__ = getattr(op, "__name__", "method")
    return method


def on_array(op: Callable) -> Callable:
    """A method that applies ``op``, a JAX operation, to the array (``array()``: while it is
    computed, as JAX dispatches one on an array not ready yet)."""
    def method(self, *args, **kwargs):
        return op(self.array(), *args, **kwargs)
    method.__name__ = getattr(op, "__name__", "method")
    return method


def _is_key(dtype) -> bool:
    """Whether ``dtype`` is a typed PRNG key's (``jax.random.key``; not a NumPy dtype)."""
    if isinstance(dtype, np.dtype):
        return False
    import jax
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _read_by(module: str, function: str | None = None) -> bool:
    """Whether the caller of a future's method is JAX's ``module`` (its ``function``): where
    JAX takes a future for an array but treats only a ``jax.Array`` key as a key."""
    frame = inspect.currentframe().f_back.f_back  # (this, the method, its caller)
    return frame.f_globals.get("__name__") == module and function in (None,
                                                                      frame.f_code.co_name)


KEY_NOT_AN_ARRAY = (
    "jax.random was given a pw.Future holding a typed PRNG key ({dtype}); jax.random takes "
    "a typed key only as a jax.Array, which a future is not. Pass its value, key.result() "
    "(waits for it), or call the jax.random function in a pw.function or jax.jit, which take "
    "futures: jax.jit(jax.random.split)(key).")


def _method(name: str) -> Callable:
    waits = name in _ON_VALUE
    method = (on_value if waits else on_array)(
        lambda v, *args, **kwargs: getattr(v, name)(*args, **kwargs))
    method.__name__ = name
    method.__doc__ = f"``jax.Array.{name}`` of the {'value (waits for it)' if waits else 'array'}."
    return method


def _property(name: str) -> property:
    return property(lambda self: getattr(self.array(), name),
                    doc=f"``jax.Array.{name}`` of the array.")


def _meant(name: str, value) -> str:
    """What setting ``name`` to ``value`` on an array means in JAX (NumPy's ``a.shape = ...``
    reshapes in place, ``a.dtype = ...`` reinterprets: JAX has operations for those)."""
    if name == "shape":
        shape = value if isinstance(value, tuple) else (value,)
        return f"fut.reshape({', '.join(map(repr, shape))}) (a new array)"
    if name == "dtype":
        try:
            return f"fut.astype(jnp.{np.dtype(value).name}) (a new array)"
        except TypeError:
            return "fut.astype(dtype) (a new array)"
    return "jax.device_put(fut.result(), sharding), or out_specs= on the pw.function"


def read_only(name: str) -> property:
    """A property over the slot ``_{name}`` that refuses to be set, as ``jax.Array``'s
    ``shape``, ``dtype`` and ``sharding`` do: set, it changed only what the future said, never
    its value. The getter is ``operator.attrgetter``, as fast as reading the slot."""
    def refuse(self, value):
        raise AttributeError(f"a pw.Future's {name} is read-only, as a jax.Array's: it is what "
                             f"the program computes. Maybe you want {_meant(name, value)}.")
    return property(operator.attrgetter(f"_{name}"), refuse,
                    doc=f"The value's {name}, known before it is computed.")


class ArrayOnDemand:
    """The array surface of a value that arrives later; a subclass has ``result()`` (the value,
    waiting for it) and ``shape``, ``dtype``, ``sharding`` and ``weak_type`` known before it."""

    __slots__ = ()
    # As jax.Array's: NumPy on the left (``np.float32(2) * fut``, ``np.ones(4) + fut``) defers
    # to the future's reflected operator, so JAX computes it, not NumPy on a host copy.
    __array_priority__ = 100

    def __array__(self, dtype=None, copy=None):
        if _is_key(self.dtype) and _read_by("jax._src.api", "_device_get"):
            import jax  # (jax.device_get copies a jax.Array key whole, NumPy cannot hold it)
            return jax.device_get(self.result())
        out = np.asarray(self.result())
        return out.astype(dtype) if dtype is not None else out

    def array(self):
        """What a JAX operation on it computes on: the value (``result()``), or where a
        subclass knows it, the array while it is computed (``Future.array``)."""
        return self.result()

    def __jax_array__(self):
        return self.array()

    def __reduce__(self):
        """A future pickles as the array it holds."""
        return self.result().__reduce__()

    __copy__ = on_value(copy.copy)
    __deepcopy__ = on_value(copy.deepcopy)

    def block_until_ready(self):
        """Wait for the value (raising the computation's error if it failed); returns the
        future itself, as ``jax.Array.block_until_ready`` returns the array."""
        self.result()
        return self

    def devices(self) -> set:
        """The devices the value lives on (known before it is there)."""
        return set(self.sharding.device_set)

    def __eq__(self, other):
        """Against a number or a NumPy value, the value's ``==`` (``loss == 0.5``, as the
        ``jax.Array``); against anything else, the future's own (``self is other``)."""
        return self.array() == other if isinstance(other, _COMPARED) else NotImplemented

    def __ne__(self, other):
        return self.array() != other if isinstance(other, _COMPARED) else NotImplemented

    __hash__ = object.__hash__  # (a key in dictionaries and sets, by identity)

    def __format__(self, spec: str) -> str:
        # f"{loss}" is format(value, ""), which for a 0-d jax.Array is the Python float's
        # digits (3.4000000953674316), not str's (3.4): a log line reads as jax.jit's does
        try:
            return format(self.result(), spec)
        except NoValueError:  # a simulated future: printed as what it is (a spec fails)
            if spec:
                raise
            return repr(self)

    def __str__(self) -> str:
        try:
            return str(self.result())
        except NoValueError:  # a simulated future: shape, dtype and times, no value
            return repr(self)

    def __setitem__(self, index, value) -> None:
        raise TypeError(
            "a pw.Future is immutable, as the jax.Array it holds is: instead of x[idx] = y, "
            "use x = x.at[idx].set(y). (flax.nnx updates its Variables so: a Module or "
            "Optimizer that a pw.function returned holds futures; to call it in train mode or "
            "update it outside a pw.function, take their values first, model = "
            "jax.tree.map(lambda v: v.result(), model), or do the update in the pw.function.)")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d (scalar) Future")
        return self.shape[0]

    @property
    def aval(self):
        """JAX's type of the value (``jax.Array.aval``), from what is known before it:
        ``jnp.asarray``, ``jnp.array`` and ``jnp.result_type`` read an argument's weak type
        there, so a future of ``f(2.0)`` promotes as the weakly typed array it holds."""
        import jax
        return jax.typeof(jax.ShapeDtypeStruct(self.shape, self.dtype, sharding=self.sharding,
                                               weak_type=self.weak_type))

    @property
    def ndim(self) -> int:
        if _is_key(self.dtype) and _read_by("jax._src.random.prng"):  # (checking key data)
            raise TypeError(KEY_NOT_AN_ARRAY.format(dtype=self.dtype))
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        """Bytes per element, from the dtype (as ``jax.Array.itemsize``)."""
        itemsize = getattr(self.dtype, "itemsize", None)
        return self.result().itemsize if itemsize is None else int(itemsize)

    @property
    def nbytes(self) -> int:
        """The whole array's bytes, from its shape and dtype (as ``jax.Array.nbytes``)."""
        return self.size * self.itemsize

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds the whole value, from the sharding."""
        sharding = self.sharding
        return (self.result() if sharding is None else sharding).is_fully_replicated


for _op in _BINARY:
    _f, _name = divmod if _op == "divmod" else getattr(operator, _op), _op.rstrip("_")
    setattr(ArrayOnDemand, f"__{_name}__", on_array(_f))
    setattr(ArrayOnDemand, f"__r{_name}__", on_array(lambda v, other, f=_f: f(other, v)))
for _name, _f in _UNARY:
    setattr(ArrayOnDemand, f"__{_name}__", on_array(_f))
for _name, _f in _TO_PYTHON:
    setattr(ArrayOnDemand, f"__{_name}__", on_value(_f))
for _name in ARRAY_METHODS:
    setattr(ArrayOnDemand, _name, _method(_name))
for _name in ARRAY_PROPERTIES:
    if _name not in vars(ArrayOnDemand):  # (those known before the value are defined above)
        setattr(ArrayOnDemand, _name, _property(_name))


def register_with_jax(cls: type) -> bool:
    """Let JAX's functions and transformations take ``cls``'s instances as the arrays they
    hold: JAX's type of one is its value's, and an argument is canonicalized to the value.
    JAX looks both up along a type's bases, so registering the base covers its subclasses.
    Returns False where this JAX has neither registry (older versions call ``__jax_array__``
    there instead)."""
    try:
        from jax._src import core, dtypes
        avals, canonical = core.pytype_aval_mappings, dtypes.canonicalize_value_handlers
    except (ImportError, AttributeError):
        return False
    avals[cls] = lambda x: core.typeof(x.array())
    canonical[cls] = lambda x: dtypes.canonicalize_value(x.array())
    _index_with(cls)
    return True


def _index_with(cls: type) -> None:
    """Let JAX's indexing take ``cls``'s instances as the arrays they hold: ``x[i]``,
    ``x[mask]``, ``x.at[i].set(v)`` with ``i`` a future. JAX parses an index by its Python type
    alone (an int, a ``jax.Array`` or a NumPy array: anything else is an IndexError, a boolean
    mask a bare AssertionError), in ``NDIndexer.from_raw_indices``, which every indexing path
    calls: that parse is given the values (waiting for them) in place of the futures."""
    try:
        from jax._src.numpy.indexing import NDIndexer
        parse = NDIndexer.from_raw_indices.__func__
    except (ImportError, AttributeError):
        return

    def from_raw_indices(indexer, indices, shape):
        if isinstance(indices, cls):
            indices = indices.array()
        elif type(indices) is tuple and any(isinstance(i, cls) for i in indices):
            indices = tuple(i.array() if isinstance(i, cls) else i for i in indices)
        return parse(indexer, indices, shape)

    from_raw_indices.__doc__ = parse.__doc__
    NDIndexer.from_raw_indices = classmethod(from_raw_indices)


register_with_jax(ArrayOnDemand)
