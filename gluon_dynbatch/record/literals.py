"""Literals: ``F.array`` of Python numbers, pooled per graph.

Models make a small array at every tree node or token (a word id for an
embedding, a label for a loss): ``F.array([word])``.  Creating an NDArray
costs tens of microseconds, more than recording the calls that use it.
Inside a scope, literals of one dtype and row shape are instead rows of one
leaf of the graph, made as one array when the graph runs (:func:`fill`);
each literal is a row view of it, so a batched step reads all of a step's
literals with one gather.
"""
import mxnet as mx
import numpy as np

from ..ir.graph import LEAF, OP, VIEW, Node
from ..ir.known import device_array, values_known, values_of
from .lazy import LazyArray, Rows


def record(rec, values, ctx=None):
    """The LazyArray of literal ``values`` (a numpy array, rows first) in ``rec``'s graph."""
    if ctx is None or ctx is rec.ctx:
        lazy = rec.literal(values)          # the common case, compiled
        if lazy is not None:
            return lazy
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
        graph.literal_leaves.add(node)
    node, parts = pool
    begin = node.out_shapes[0][0] if parts else 0
    end = begin + len(values)
    parts.append(values)
    graph.literal_parts[(node, begin)] = values
    node.out_shapes = ((end,) + values.shape[1:],)
    return rec.row_slice(LazyArray(node, 0), begin, end)


def key_item(rec, array, shape, dtype):
    """The frame key item of ``array``, read from outside: marked when its values
    are known (``values_known``), since rules analysed on it may read them."""
    if type(array) is LazyArray:
        node = array._node
        if node is not None and getattr(node, "kind", None) == OP and node.graph is rec.graph:
            return ("x", shape, dtype)          # the usual case: an operator's output
    return ("x", shape, dtype, values_known(rec.value_of(array)[0]))


def _known_source(rec, x):
    """The graph node of array ``x`` if its values are known (``values_known``), else None.

    Values computed in the scope are not known, and are not asked (asking
    would run them).
    """
    found = x._node if type(x) is LazyArray else None
    if found is not None and getattr(found, "kind", None) not in (VIEW, LEAF):
        return None
    source = rec.value_of(x)[0]
    return source if values_known(source) else None


def is_known(rec, x):
    """Whether the values of array ``x`` are known (``values_known``)."""
    return _known_source(rec, x) is not None


def known_values(rec, x):
    """The numpy values of array ``x`` if they are known (``is_known``), else None."""
    source = _known_source(rec, x)
    if source is None:
        return None
    rec.tainted = True          # what is recorded depends on these values
    return values_of(source)


def fill(graph):
    """Give each pool of ``graph`` its value: one array per dtype and row shape."""
    for node, parts in graph.literals.values():
        if node.value is None:
            values = parts[0] if len(parts) == 1 else np.concatenate(parts)
            node.value = device_array(values, graph.ctx)


def hand_out(graph, live, token=None):
    """Give held literals their rows of the pool directly; the other live outputs.

    A literal is a constant, as ``nd.array`` makes one: handed out through a
    batched gather it would carry autograd history, and an operator that
    refuses gradients for its data (``Embedding``'s indices) would then fail
    in a later scope.  Inside a scope (``token``: its ``Recorder.rows_token``)
    each held literal is its rows of the pool (``lazy.Rows``, never recorded),
    cut out only if used as an array; else a view of the pool at once.
    """
    if not graph.literals:
        return live
    pools = {node for node, _ in graph.literals.values()}
    rest, held = [], {}
    for node, idx, lazy in live:
        if node.kind == VIEW and node.inputs[0][0] in pools:
            begin, end = node.kwargs["begin"], node.kwargs["end"]
            if token is None:
                rows = node.inputs[0][0].value[begin:end]
                lazy._set_result(rows)  # pylint: disable=protected-access
                continue
            found = held.setdefault(node.inputs[0][0], (node, [], []))
            found[1].append(lazy)
            found[2].append((begin, end))
        else:
            rest.append((node, idx, lazy))
    for pool, (node, lazies, bounds) in held.items():
        Rows(pool.value, None, (False, False), token, node.out_shapes[0][1:],
             node.out_dtypes[0], bounds=bounds, literal=True).hand_out(lazies)
    return rest
