"""Calls on weights only: one node per graph, shared by every sample.

A call whose every array is a parameter (or computed so) gives the same value
for every sample: Gluon's fused RNN layers flatten and concatenate their
weights on every call, and users transpose or slice a weight in
``hybrid_forward``.  Recorded once per graph, the value is one node that
every sample reads, so the calls that read it batch (their signature sees one
shared input) and its gradient sums the samples' contributions as eager
execution's separate copies do.  Random operators draw anew at each call and
stay one node per call.
"""
from .calls import STATEFUL
from .graph import LEAF, OP
from .lazy import LazyArray

# Words in the names of operators whose result is not a function of their arguments.
_RANDOM_WORDS = ("random", "sample", "shuffle", "Dropout", "uniform", "normal")
_DETERMINISTIC = {}     # OpDef -> deterministic(op)


def deterministic(op):
    """Whether ``op`` gives the same result each time it is called on the same arrays."""
    found = _DETERMINISTIC.get(op)
    if found is None:
        found = _DETERMINISTIC[op] = op.name not in STATEFUL and "random" not in op.path \
            and not any(word in op.name for word in _RANDOM_WORDS)
    return found


def weight_node(src):
    """Whether node ``src`` is a parameter or a value its graph computed from
    weights alone (False for frames and analysis stand-ins)."""
    if src.kind == LEAF:
        return src.param is not None
    return src.kind == OP and getattr(src, "graph", None) is not None \
        and src.id in src.graph.weight_nodes


def on_weights(rec, op, inputs):
    """Whether every input (``(node, idx)``) of the current graph is a weight
    (``weight_node``) and ``op`` deterministic."""
    graph = rec.graph
    return all(src.graph is graph and weight_node(src) for src, _ in inputs) \
        and deterministic(op)


def is_weight(rec, array):
    """Whether ``array`` is known, without recording anything, as a parameter or
    a value computed from weights alone in the current graph."""
    graph = rec.graph
    if type(array) is not LazyArray or array._node is None:
        found = graph.shared_items.get(id(array))
        return found is not None and found[0] == "p"
    node = array._node
    return weight_node(node) and node.graph is graph


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
        graph.weight_nodes.add(node.id)
        return out
    if len(node.out_shapes) > 1:
        return [node.output(k) for k in range(len(node.out_shapes))]
    return node.output(0)
