"""Literals: ``F.array`` of Python numbers, pooled per graph.

Models make a small array at every tree node or token (a word id for an
embedding, a label for a loss): ``F.array([word])``.  Creating an NDArray
costs tens of microseconds, more than recording the calls that use it.
Inside a scope, literals of one dtype and row shape are instead rows of one
leaf of the graph, made as one array when the graph runs (:func:`fill`);
each literal is a row view of it, so a batched step reads all of a step's
literals with one gather.
"""
import ctypes

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, SymbolHandle
from mxnet.symbol import Symbol

from . import weight_calls
from .graph import LEAF, OP, VIEW, Node
from .lazy import LazyArray


def record(rec, values, ctx=None):
    """The LazyArray of literal ``values`` (a numpy array, rows first) in ``rec``'s graph."""
    rec._set_ctx(ctx or rec.ctx or mx.current_context())  # pylint: disable=protected-access
    graph = rec.graph
    if len(graph.nodes) + 2 >= rec.max_pending:
        rec.flush()
        graph = rec.graph
    key = (values.dtype.str, values.shape[1:])
    pool = graph.literals.get(key)
    if pool is None:
        node = graph.add(Node(graph, LEAF))
        node.out_dtypes = (values.dtype.type,)
        pool = graph.literals[key] = (node, [])
        graph.literal_ids.add(node.id)
    node, parts = pool
    begin = node.out_shapes[0][0] if parts else 0
    end = begin + len(values)
    parts.append(values)
    graph.literal_parts[(node.id, begin)] = values
    node.out_shapes = ((end,) + values.shape[1:],)
    return rec.row_slice(LazyArray(node, 0), begin, end)


def known_node(node):
    """Whether the values of graph node ``node`` (or of anything else: no) are
    known before its graph runs and constant to autograd, so that a batching
    rule may read them when it plans (``values_of``): a literal's view, or a
    leaf holding an array that is no parameter, takes no gradient and has no
    recorded history (``nd.array(...)`` given to the model).  Asked once per
    leaf and graph."""
    kind = getattr(node, "kind", None)
    if kind == VIEW:
        return node.inputs[0][0].id in node.graph.literal_ids
    if kind != LEAF or node.param is not None or node.value is None:
        return False
    known = node.graph.known_leaves
    found = known.get(node.id)
    if found is None:
        found = known[node.id] = _constant(node.value)
    return found


def _constant(array):
    """Whether autograd treats ``array`` as a constant, as eager MXNet would."""
    if array.grad is not None:
        return False
    # ``autograd.get_symbol``, without the Python exception it raises for the
    # common answer (an array made from data: "not part of a computation graph").
    handle = SymbolHandle()
    if _LIB.MXAutogradGetSymbol(array.handle, ctypes.byref(handle)) != 0:
        return True
    return len(Symbol(handle).get_internals().list_outputs()) == 1


def key_item(rec, array, shape, dtype):
    """The frame key item of ``array``, read from outside: marked when its values
    are known (``known_node``), since rules analysed on it may read them."""
    if type(array) is LazyArray:
        node = array._node
        if node is not None and getattr(node, "kind", None) == OP and node.graph is rec.graph:
            return ("x", shape, dtype)          # the usual case: an operator's output
    return ("x", shape, dtype, known_node(rec.value_of(array)[0]))


def values_of(node):
    """The numpy values of ``node``, known (``known_node``): a literal's view, or
    a leaf (given, or a literal run by a flush: a read, ``max_pending_nodes``)."""
    if node.kind == LEAF:
        return node.value.asnumpy()
    pool, begin, end = node.inputs[0][0], node.kwargs["begin"], node.kwargs["end"]
    found = node.graph.literal_parts.get((pool.id, begin))
    if found is not None and len(found) == end - begin:
        return found                    # the usual case: a literal's own view
    for leaf, parts in node.graph.literals.values():     # rows of a part, or of several
        if leaf is pool:
            for part in parts:
                if begin < len(part):
                    if end <= len(part):
                        return part[begin:end]
                    break
                begin, end = begin - len(part), end - len(part)
            return np.concatenate(parts)[node.kwargs["begin"]:node.kwargs["end"]]
    raise ValueError("%r is not a literal" % (node,))


MAX_RUNS = 4        # more runs of rows than this: one take (layer_rules.KnownTakeRule)


def take_rows(ns, data, indices, kwargs):
    """``F.take(data, F.array(idx))`` of a pending value by a known index vector
    (``known_node``) along axis 0, picking few runs of ``data``'s rows: those runs (views, which
    move rows only) concatenated; None for any other take (a weight's rows
    batch as they are, many runs as one take: ``layer_rules.KnownTakeRule``).

    A sample's own rows picked by a list of its own (positions of some words,
    a graph's edge ends) would otherwise be a call per sample.
    """
    if not isinstance(indices, mx.nd.NDArray) or len(indices.shape) != 1 \
            or type(data) is not LazyArray \
            or not data.shape or not set(kwargs) <= {"axis", "mode"} \
            or kwargs.get("axis", 0) not in (0, -len(data.shape)) \
            or kwargs.get("mode", "clip") not in ("clip", "wrap") \
            or getattr(data._node, "kind", None) == LEAF \
            or weight_calls.is_weight(ns._recorder, data):  # pylint: disable=protected-access
        return None
    values = known_values(ns._recorder, indices)  # pylint: disable=protected-access
    if values is None:
        return None
    rows = taken_rows(values, data.shape[0], kwargs.get("mode", "clip"))
    starts = [0] + [k for k in range(1, len(rows)) if rows[k] != rows[k - 1] + 1]
    if len(starts) > MAX_RUNS:
        return None
    parts = [ns.slice_axis(data, axis=0, begin=int(rows[b]), end=int(rows[e - 1]) + 1)
             for b, e in zip(starts, starts[1:] + [len(rows)])]
    return parts[0] if len(parts) == 1 else ns.concat(*parts, dim=0)


def _known_source(rec, x):
    """The graph node of array ``x`` if its values are known (``known_node``), else None.

    Values computed in the scope are not known, and are not asked (asking
    would run them).
    """
    found = x._node if type(x) is LazyArray else None
    if found is not None and getattr(found, "kind", None) not in (VIEW, LEAF):
        return None
    source = rec.value_of(x)[0]
    return source if known_node(source) else None


def is_known(rec, x):
    """Whether the values of array ``x`` are known (``known_node``)."""
    return _known_source(rec, x) is not None


def known_values(rec, x):
    """The numpy values of array ``x`` if they are known (``is_known``), else None."""
    source = _known_source(rec, x)
    return None if source is None else values_of(source)


def taken_rows(indices, size, mode):
    """The rows ``take`` reads for ``indices`` of a value of ``size`` rows, as MXNet
    computes them: each index truncated, then clipped or wrapped."""
    rows = np.trunc(indices).astype(np.int64)
    return np.clip(rows, 0, size - 1) if mode == "clip" else rows % size


def fill(graph):
    """Give each pool of ``graph`` its value: one array per dtype and row shape."""
    for node, parts in graph.literals.values():
        if node.value is None:
            values = parts[0] if len(parts) == 1 else np.concatenate(parts)
            node.value = mx.nd.array(values, ctx=graph.ctx, dtype=values.dtype)


def hand_out(graph, live):
    """Give held literals their rows of the pool directly; the other live outputs.

    A literal is a constant, as ``nd.array`` makes one: handed out through a
    batched gather it would carry autograd history, and an operator that
    refuses gradients for its data (``Embedding``'s indices) would then fail
    in a later scope.
    """
    if not graph.literals:
        return live
    pools = {node for node, _ in graph.literals.values()}
    rest = []
    for node, idx, lazy in live:
        if node.kind == VIEW and node.inputs[0][0] in pools:
            pool = node.inputs[0][0].value
            rows = pool[node.kwargs["begin"]:node.kwargs["end"]]
            lazy._set_result(rows)  # pylint: disable=protected-access
        else:
            rest.append((node, idx, lazy))
    return rest
