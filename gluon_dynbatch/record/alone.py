"""Calls whose output shapes depend on their data: run by themselves, now.

A recorded call must know its output shapes before anything runs; MXNet's
inference gives them from the input shapes, except for operators whose
output depends on the values (``F.contrib.boolean_mask``) and for calls on
empty arrays (a sentence of no words).  Such a call (``calls.ShapeFromData``)
runs as eager MXNet runs it: the values it reads are computed first (what is
pending runs, as a read of a value does), the operator runs on them, and its
outputs enter the graph as inputs, with their autograd history.  Where eager
MXNet raises, the error names the sample and the call.

A user's ``mx.autograd.Function`` runs the same way: its ``forward`` is
Python that MXNet's autograd links to the Function's own ``backward``
through the arrays it is given and returns, which must be those of that
call alone; its outputs enter the graph as inputs, with that history.
"""
import mxnet as mx
from mxnet.ndarray import NDArray

from .lazy import LazyArray
from . import context
from ..errors import BatchingError, describe_call, refused_call
from ..ir.graph import LEAF
from ..ir.calls import note_sparse_output
from ..ir.ops import first_line, hashable
from ..ir.rules import NO_INPUT_GRADIENT


def run_alone(rec, op, args, kwargs):
    """``op(*args, **kwargs)`` run now on concrete values; its outputs as leaves."""
    args = _computed(args)
    kwargs = dict(zip(kwargs, _computed(kwargs.values())))
    for k in NO_INPUT_GRADIENT.get(op.name, ()):
        if k < len(args) and isinstance(args[k], NDArray):
            args[k] = args[k].detach()
    arrays = [a for a in args + list(kwargs.values()) if isinstance(a, NDArray)]
    try:
        out = op.nd_fn(*args, **kwargs)
    except Exception as err:  # MXNetError, and MXNet's own argument checks
        raise refused_call(err, "%s: invalid call with input shapes %s: %s" % (
            describe_call(rec.sample, rec.path, op.name), [a.shape for a in arrays],
            first_line(err))) from None
    storage = tuple(a.stype for a in arrays)
    if any(stype != "default" for stype in storage):
        # (``calls.sparse_output`` sent it here to find out its outputs' storage)
        note_sparse_output(op.name, storage, tuple(sorted(
            (k, hashable(v)) for k, v in kwargs.items() if not isinstance(v, NDArray))),
            out if isinstance(out, (list, tuple)) else [out])
    return rec.wrap_inputs(out)


def _computed(values):
    """The arrays ``values`` stand for (``_concrete``), each computed first:
    what is pending runs, as a read of a value does."""
    values = [_concrete(v) for v in values]
    for value in values:
        if isinstance(value, NDArray):
            value.wait_to_read()
    return values


def _concrete(value):
    """The array an input of the graph stands for (an array given to the model, a
    parameter's data), else ``value`` itself."""
    if type(value) is LazyArray and value._h is None:
        node = value._node
        if node is not None and node.kind == LEAF:
            return node.value if node.value is not None else node.param.data(node.graph.ctx)
    return value


_FUNCTION_CALL = mx.autograd.Function.__call__


def _function_call(self, *inputs):
    """``mx.autograd.Function.__call__``: inside a scope, on concrete values
    (what is pending runs first, as a read of a value does)."""
    rec = context.TLS.recorder
    if rec is None or rec.eager:
        return _FUNCTION_CALL(self, *inputs)
    held = _holds_values(self)
    if not held and not any(type(a) is LazyArray for a in inputs):
        return _FUNCTION_CALL(self, *inputs)
    frame = rec.frame
    if frame is not None:
        # No template may replay this call's block without running the Function.
        frame.cut("an autograd.Function")
    if held:
        _make_plain(self)
    # Plain arrays, with the values' autograd history: the Function's
    # ``forward`` and ``backward`` compute on them as eager code does.
    return rec.wrap_inputs(_FUNCTION_CALL(self, *[_plain(a) for a in inputs]))


_DEPTH = 4
"""How deep into containers and objects a Function's held values are looked for."""


def _closures(function):
    """The closure cells of the Function's ``forward`` and ``backward``."""
    for name in ("forward", "backward"):
        code = getattr(type(function), name, None)
        yield from getattr(code, "__closure__", None) or ()


def _holds_values(function):
    """Whether a Function holds values a scope computed: in its attributes (given
    to its constructor) or its methods' closures, directly, in lists, tuples,
    dicts, or attributes of other objects."""
    return any(_walk(value, _DEPTH, set(), None) is not None
               for value in list(vars(function).values())
               + [cell.cell_contents for cell in _closures(function)])


def _make_plain(function):
    """Give the Function computed plain arrays in place of the values a scope
    computed that it holds (``_holds_values``): its ``forward`` and
    ``backward`` run on them as eager MXNet runs them (calls on a LazyArray
    would be recorded).  Containers holding them are copied; other objects'
    attributes and the closures' cells are set."""
    for name, value in list(vars(function).items()):
        found = _walk(value, _DEPTH, set(), _plain)
        if found is not None:
            setattr(function, name, found)
    for cell in _closures(function):
        found = _walk(cell.cell_contents, _DEPTH, set(), _plain)
        if found is not None:
            cell.cell_contents = found


def _walk(value, depth, seen, replace):
    """``value`` with every LazyArray in it replaced by ``replace(array)``, or
    None where it holds none (``replace`` None: only whether it holds one)."""
    if type(value) is LazyArray:
        return value if replace is None else replace(value)
    if depth == 0 or id(value) in seen or isinstance(value, (NDArray, str, bytes, type)) \
            or isinstance(value, (mx.gluon.Block, mx.gluon.Parameter)):
        return None
    seen.add(id(value))
    if isinstance(value, (list, tuple, dict)):
        pairs = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        found = {k: _walk(v, depth - 1, seen, replace) for k, v in pairs}
        if all(v is None for v in found.values()):
            return None
        if replace is None:
            return value
        items = [(k, v if found[k] is None else found[k]) for k, v in pairs]
        if isinstance(value, dict):
            return type(value)(items)
        if isinstance(value, tuple) and hasattr(value, "_fields"):     # a namedtuple
            return type(value)(*[v for _, v in items])
        return type(value)([v for _, v in items])
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict) or callable(value):
        return None
    held = None
    for name, item in list(attributes.items()):
        found = _walk(item, depth - 1, seen, replace)
        if found is not None:
            held = value
            if replace is not None:
                setattr(value, name, found)
    return held


def _plain(value):
    """A plain array of ``value``'s data and history, ``value`` computed first."""
    value, = _computed([value])
    return mx.nd.identity(value) if type(value) is LazyArray else value


def install():
    """Run ``mx.autograd.Function`` calls inside scopes on concrete values."""
    mx.autograd.Function.__call__ = _function_call
