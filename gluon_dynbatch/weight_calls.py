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
from .graph import LEAF

# Words in the names of operators whose result is not a function of their arguments.
_RANDOM_WORDS = ("random", "sample", "shuffle", "Dropout", "uniform", "normal")


def deterministic(op):
    """Whether ``op`` gives the same result each time it is called on the same arrays."""
    return op.name not in STATEFUL and "random" not in op.path \
        and not any(word in op.name for word in _RANDOM_WORDS)


def on_weights(rec, op, inputs):
    """Whether every input (``(node, idx)``) is a parameter or the output of a
    call on weights only, and ``op`` deterministic."""
    graph = rec.graph
    for src, _ in inputs:
        if src.kind == LEAF:
            if src.param is None:
                return False
        elif src.graph is not graph or src.id not in graph.weight_nodes:
            return False
    return deterministic(op)


def is_weight(rec, array):
    """Whether ``array`` is known, without recording anything, as a parameter or
    a value computed from weights only in the current graph."""
    node = getattr(array, "_node", None)
    graph = rec.graph
    if node is None or type(array).__name__ != "LazyArray":
        found = graph.shared_items.get(id(array))
        return found is not None and found[0] == "p"
    if node.graph is not graph:
        return False
    if node.kind == LEAF:
        return node.param is not None
    return node.id in graph.weight_nodes


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
