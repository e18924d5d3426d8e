"""Calls on weights only: one node per graph, shared by every sample.

A call whose every array is a parameter (or computed so) gives the same value
for every sample: Gluon's fused RNN layers flatten and concatenate their
weights on every call, and users transpose or slice a weight in
``hybrid_forward``.  Recorded once per graph, the value is one node that
every sample reads, so the calls that read it batch (their signature sees one
shared input) and its gradient sums the samples' contributions as eager
execution's separate copies do.  Random operators draw anew at each call and
stay one node per call.

Such a value is named, in the keys of frames (``frames.py``), by a
:class:`DerivedWeight`: its call, with parameters for arrays, the same in every
graph.  A child block whose calls read it (a fused RNN layer reads the
concatenation of its flattened weights) can then be learned once and
replayed, as if it read parameters only; the replay makes the value again in
its own graph (``resolve``).
"""
import numpy as np

from ..ir.calls import STATEFUL
from ..ir.graph import LEAF, weight_node
from .lazy import LazyArray, output_of

# Words in the names of operators whose result is not a function of their arguments.
_RANDOM_WORDS = ("random", "sample", "shuffle", "Dropout", "uniform", "normal")
_DETERMINISTIC = {}     # OpDef -> deterministic(op)


def deterministic(op):
    """Whether ``op`` gives the same result each time it is called on the same arrays."""
    found = _DETERMINISTIC.get(op)
    if found is None:
        found = _DETERMINISTIC[op] = op.name not in STATEFUL and "random" not in (op.path or ()) \
            and not any(word in op.name for word in _RANDOM_WORDS)
    return found


# Casts to half precision: one value shared by every sample would sum the
# samples' gradients in float16 (rounding, overflow past 65504) where eager
# code converts each sample's to the weight's dtype first.
_CASTS = ("Cast", "cast", "amp_cast")       # (``x.astype`` is recorded as ``Cast``)


def half_cast(op, args, kwargs):
    """Whether the call casts to float16 (``F.cast(w, "float16")``, ``amp_cast``)."""
    if op.name not in _CASTS:
        return False
    dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
    try:
        return dtype is not None and np.dtype(dtype) == np.float16
    except TypeError:
        return False


def on_weights(rec, op, inputs, args=(), kwargs=None):
    """Whether every input (``(node, idx)``) of the current graph is a weight
    (``weight_node``) and ``op`` deterministic, and not a cast to half precision."""
    graph = rec.graph
    return all(src.graph is graph and weight_node(src) for src, _ in inputs) \
        and deterministic(op) and not half_cast(op, args, kwargs or {})


def is_weight(rec, array):
    """Whether ``array`` is known, without recording anything, as a parameter or
    a value computed from weights alone in the current graph."""
    graph = rec.graph
    if type(array) is not LazyArray or array._node is None:
        found = graph.shared_items.get(id(array))
        return found is not None and found[0] == "p"
    node = array._node
    return weight_node(node) and node.graph is graph


class DerivedWeight:
    """Output ``idx`` of call ``call`` on weights alone, as a frame key names it.

    ``call`` is ``(op, items, targs, keywords)`` with a Parameter or a
    DerivedWeight per array input; interned (``_derived``), so equal calls
    give the same object in every graph.  It stands where a Parameter would
    in key items (``("p", it)``): ``shape``, ``dtype`` and ``data()`` answer
    what a template asks of a Parameter, and ``Recorder.param`` resolves it.
    """

    __slots__ = ("call", "idx", "shape", "dtype")

    def __init__(self, call, idx, shape, dtype):
        self.call, self.idx, self.shape, self.dtype = call, idx, shape, dtype

    def data(self, ctx=None):  # pylint: disable=unused-argument
        """Itself: what is read of a Parameter's data here is its shape and dtype."""
        return self

    def __repr__(self):
        return "DerivedWeight(%s, %d)" % (self.call[0].name, self.idx)


_DERIVED = {}
MAX_DERIVED = 4096


def _derived(graph, node, inputs, targs, tkw):
    """Name the outputs of weight node ``node`` (``graph.derived``); None if an
    input is not named (a weight of another graph)."""
    items = []
    for src, idx in inputs:
        if src.kind == LEAF:
            items.append(src.param)
        else:
            found = graph.derived.get(src.id)
            if found is None:
                return None
            items.append(found[idx])
    call = (node.op, tuple(items), targs, tuple(sorted(tkw.items())))
    names = []
    for idx, (shape, dtype) in enumerate(zip(node.out_shapes, node.out_dtypes)):
        found = _DERIVED.get((call, idx))
        if found is None:
            if len(_DERIVED) >= MAX_DERIVED:
                _DERIVED.clear()        # rare; live tries keep the ones they name
            found = _DERIVED.setdefault((call, idx), DerivedWeight(call, idx, shape, dtype))
        names.append(found)
        graph.derived_nodes[id(found)] = (found, node)
    graph.derived[node.id] = names
    return names


def resolve(rec, derived):
    """The LazyArray of ``derived`` in ``rec``'s graph: its call made there once."""
    found = rec.graph.derived_nodes.get(id(derived))     # asked by every sample
    if found is not None and found[0] is derived:
        return output_of(found[1], derived.idx)
    op, items, targs, keywords = derived.call
    inputs = [rec.value_of(rec.param(item)) for item in items]
    out = shared_call(rec, op, inputs, targs, dict(keywords))
    return out[derived.idx] if isinstance(out, list) else out


def shared_call(rec, op, inputs, targs, tkw):
    """The output(s) of ``op`` on weights ``inputs``: the graph's node of this call
    if it has one, else a new node (see :meth:`Recorder.add_node`)."""
    graph = rec.graph
    try:
        key = (op, tuple([(src.id, idx) for src, idx in inputs]), targs,
               tuple(sorted(tkw.items())))
        node = graph.weight_calls.get(key)
    except TypeError:                   # an unhashable constant argument
        return rec.add_node(op, inputs, targs, tkw)
    if node is None:
        out = rec.add_node(op, inputs, targs, tkw)
        node = (out[0] if isinstance(out, list) else out)._node
        graph.weight_calls[key] = node
        graph.weight_nodes.add(node)
        _derived(graph, node, inputs, targs, tkw)
        return out
    if len(node.out_shapes) > 1:
        return [output_of(node, k) for k in range(len(node.out_shapes))]
    return output_of(node, 0)


def install():
    """Parameter methods that give a parameter new arrays (``initialize`` with
    ``force_reinit``, ``_init_impl``, which ``reset_ctx`` and loading call, and
    ``cast``) first run the pending calls that read its old ones
    (``Recorder.before_replace``)."""
    from mxnet.gluon import Parameter  # pylint: disable=import-outside-toplevel
    for name in ("initialize", "_init_impl", "cast"):
        setattr(Parameter, name, _replacing(getattr(Parameter, name)))
    Parameter.grad_req = _setting_grad_req(Parameter.grad_req)
    from mxnet.kvstore import KVStore  # pylint: disable=import-outside-toplevel
    for name, place in (("pull", 1), ("row_sparse_pull", 1), ("pushpull", 2),
                        ("broadcast", 2)):
        if hasattr(KVStore, name):
            setattr(KVStore, name, _pulling(getattr(KVStore, name), place))


def _setting_grad_req(prop):
    """``Parameter.grad_req`` whose setter, inside a scope, first runs the pending
    calls that read the parameter when its gradient changes (``"null"`` to
    ``"write"``: a layer frozen for the first samples, trained on the next
    ones): they ran with the old setting in eager code."""
    from . import context  # pylint: disable=import-outside-toplevel

    def setter(self, req):
        rec = context.current()
        if rec is not None and getattr(self, "_data", None) and req != self._grad_req \
                and (self._differentiable or self._grad_req != "null"):
            rec.before_replace(self, "a parameter that recorded calls read has its grad_req "
                                     "set (%r to %r)" % (self._grad_req, req))
        prop.fset(self, req)

    return property(prop.fget, setter, prop.fdel, prop.__doc__)


def _pulling(original, place):
    """``original``, a method of KVStore writing the arrays given as ``out`` (its
    argument at ``place``, ``self`` not counted; ``pushpull`` without ``out``
    writes ``value``): new weights pulled after an update on the store
    (``Trainer.step`` with ``update_on_kvstore``).  The pending calls that
    read them run first (``Recorder.before_write``): MXNet writes them
    without an operator."""
    from . import context  # pylint: disable=import-outside-toplevel

    def pulling(self, *args, **kwargs):
        rec = context.current()
        if rec is not None:
            out = kwargs.get("out", args[place] if len(args) > place else None)
            if out is None and original.__name__ == "pushpull":
                out = kwargs.get("value", args[1] if len(args) > 1 else None)
            if out is not None:
                rec.before_write(_flat_arrays(out))
        return original(self, *args, **kwargs)

    pulling.__name__ = pulling.__qualname__ = original.__name__
    pulling.__doc__ = original.__doc__
    return pulling


def _flat_arrays(out):
    """The NDArrays of ``out``: an array, or lists of them (one per device)."""
    if isinstance(out, (list, tuple)):
        return [a for item in out for a in _flat_arrays(item)]
    return [out]


def _replacing(original):
    """``original``, a method of Parameter that may replace its arrays, running
    what is pending first inside a scope."""
    from . import context  # pylint: disable=import-outside-toplevel

    def replacing(self, *args, **kwargs):
        rec = context.current()
        if rec is not None and getattr(self, "_data", None) and \
                (original.__name__ != "initialize" or _forced(args, kwargs)):
            rec.before_replace(self)
        return original(self, *args, **kwargs)

    replacing.__name__ = replacing.__qualname__ = original.__name__
    replacing.__doc__ = original.__doc__
    return replacing


def _forced(args, kwargs):
    """Whether ``Parameter.initialize(*args, **kwargs)`` re-initialises."""
    return bool(kwargs.get("force_reinit", args[3] if len(args) > 3 else False))
