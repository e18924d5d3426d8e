# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled loops of the sums pass (``sums.rewrite``).

A flush whose graph holds additions visits every node recorded after the
first of them: once to count the reads of each addition, once to drop the
additions folded into a chain and number the nodes again, once for their
depths.  A model recorded operator by operator records thousands of nodes a
flush, so the visits are compiled: node ids index flat arrays instead of
dictionaries keyed by node, and the nodes' slots are read in place (borrowed,
as ``ir._scan`` reads them), without attribute lookups or reference counts.
"""
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t, PyLong_FromSsize_t
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdlib cimport calloc, free

cdef str LEAF = "leaf", OP = "op"
cdef Py_ssize_t N_ID = -1, N_KIND, N_INPUTS, N_DEPS, N_DEPTH
cdef object NODE = None


def bind(node_class, slot_offset):
    """Learn where ``graph.Node`` keeps the slots the pass reads and writes
    (``slot_offset(cls, name)``: ``ir._scan.slot_offset``)."""
    global N_ID, N_KIND, N_INPUTS, N_DEPS, N_DEPTH, NODE
    NODE = node_class
    N_KIND = slot_offset(node_class, "kind")
    N_INPUTS = slot_offset(node_class, "inputs")
    N_DEPS = slot_offset(node_class, "deps")
    N_DEPTH = slot_offset(node_class, "depth")
    N_ID = slot_offset(node_class, "id")


cdef inline PyObject* _slot(PyObject* o, Py_ssize_t off):
    """Slot ``off`` of node ``o``, borrowed (every slot read here is set by
    ``Node``'s constructor)."""
    return (<PyObject**>((<char*>o) + off))[0]


cdef inline void _set_slot(PyObject* o, Py_ssize_t off, object value):
    """Set slot ``off`` of node ``o`` to ``value``."""
    cdef PyObject** field = <PyObject**>((<char*>o) + off)
    cdef PyObject* old = field[0]
    Py_INCREF(value)
    field[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline Py_ssize_t _id(PyObject* node) except? -1:
    """The id of node ``node`` (its position in its graph's nodes)."""
    return PyLong_AsSsize_t(<object>_slot(node, N_ID))


cdef inline PyObject* _source(PyObject* value):
    """The node of an input ``(node, index)``."""
    return PyTuple_GET_ITEM(<object>value, 0)


cdef void _check(list nodes, Py_ssize_t first=0) except *:
    """Every node of ``nodes`` from ``first`` on a ``graph.Node`` (the offsets
    are its slots')."""
    cdef Py_ssize_t k
    if N_ID < 0:
        raise RuntimeError("_sums.bind was not called")
    for k in range(first, PyList_GET_SIZE(nodes)):
        if type(<object>PyList_GET_ITEM(nodes, k)) is not NODE:
            raise TypeError("not a graph node: %r" % (nodes[k],))


def chained(list links, frozenset adds):
    """Whether any of ``links`` would start or extend a chain (a cheap first
    look): an ``add_n`` or an addition of zero, or an addition reading another."""
    cdef object node, value, src, info
    for node in links:
        if node.op.name not in adds:
            return True
        for value in node.inputs:
            src = (<tuple>value)[0]
            if src.kind == OP:
                info = src.info
                if info is not None and info.link:
                    return True
    return False


cdef int* _link_uses(list nodes, list links, Py_ssize_t first) except NULL:
    """Per node id, how often the nodes after ``first`` read it if it is one of
    ``links`` (an ordering constraint counts twice: never absorbed); -1 for
    nodes that are not links.  The caller frees the array."""
    cdef Py_ssize_t n = PyList_GET_SIZE(nodes), k, j, i
    cdef int* uses = <int*>calloc(n if n > 0 else 1, sizeof(int))
    cdef PyObject* node
    cdef PyObject* inputs
    cdef PyObject* deps
    if uses == NULL:
        raise MemoryError()
    for k in range(n):
        uses[k] = -1
    for k in range(PyList_GET_SIZE(links)):
        i = _id(PyList_GET_ITEM(links, k))
        if not 0 <= i < n:
            free(uses)
            raise RuntimeError("internal error: an addition not in its graph")
        uses[i] = 0
    for k in range(first + 1, n):
        node = PyList_GET_ITEM(nodes, k)
        inputs = _slot(node, N_INPUTS)
        for j in range(len(<object>inputs)):
            i = _id(_source(PyList_GET_ITEM(<object>inputs, j)) if type(<object>inputs) is list
                    else _source(PyTuple_GET_ITEM(<object>inputs, j)))
            if 0 <= i < n and uses[i] >= 0:
                uses[i] += 1
        deps = _slot(node, N_DEPS)
        for j in range(PyTuple_GET_SIZE(<object>deps)):
            i = _id(PyTuple_GET_ITEM(<object>deps, j))
            if 0 <= i < n and uses[i] >= 0:
                uses[i] += 2
    return uses


def chains(list nodes, list links, frozenset adds, Py_ssize_t max_terms, object held):
    """``(absorbed, roots)``: a mark per node id of the links folded into a later
    one, and each chain's last link with its terms.

    A link is folded into the link reading it when that is its only read and
    the user does not hold its value (``held(link)``), up to ``max_terms``
    terms a chain.  A chain counts when it has two additions or more, or an
    ``add_n`` or an addition of zero.
    """
    _check(links)
    cdef Py_ssize_t n = len(nodes), first = links[0].id, i, count
    _check(nodes, first)
    cdef int* uses = _link_uses(nodes, links, first)
    cdef bytearray absorbed = bytearray(n)
    cdef list found = [None] * n      # link id -> [terms, additions, signal]
    cdef list terms, inner
    cdef object node, value, src
    cdef bint signal
    cdef dict roots = {}
    try:
        for node in links:                    # creation order
            terms = []
            count, signal = 1, node.op.name not in adds
            for value in node.inputs:
                src = (<tuple>value)[0]
                i = _id(<PyObject*>src)
                inner = found[i] if 0 <= i < n else None
                if inner is not None and uses[i] == 1 and not held(src) \
                        and len(terms) + len(<list>inner[0]) + len(node.inputs) <= max_terms:
                    absorbed[i] = 1
                    found[i] = None
                    terms.extend(<list>inner[0])
                    count += <Py_ssize_t>inner[1]
                    signal = signal or inner[2]
                else:
                    terms.append(value)
            found[_id(<PyObject*>node)] = [terms, count, signal]
    finally:
        free(uses)
    for node in links:
        inner = found[_id(<PyObject*>node)]
        if inner is not None and (<Py_ssize_t>inner[1] >= 2 or inner[2]):
            roots[node] = inner[0]
    return absorbed, roots


def rebuild(list nodes, Py_ssize_t first, bytearray absorbed, dict roots, object stack_view):
    """The nodes without the ``absorbed`` links, each root after the view
    ``stack_view(root, terms)`` makes (turning the root into the sum), ids
    numbered again in that order and depths computed again from ``first`` on
    (in the same visit: a node's inputs come before it)."""
    _check(nodes, first)
    cdef list kept = nodes[:first]
    cdef Py_ssize_t n = len(nodes), k
    cdef object node, terms, view
    for k in range(first, n):
        node = <object>PyList_GET_ITEM(nodes, k)
        if absorbed[_id(<PyObject*>node)]:
            continue
        terms = roots.get(node)
        if terms is not None:
            view = stack_view(node, terms)
            if type(view) is not NODE:
                raise TypeError("not a graph node: %r" % (view,))
            _set_slot(<PyObject*>view, N_ID, PyLong_FromSsize_t(len(kept)))
            _redepth(<PyObject*>view)
            kept.append(view)
        _set_slot(<PyObject*>node, N_ID, PyLong_FromSsize_t(len(kept)))
        _redepth(<PyObject*>node)
        kept.append(node)
    return kept


cdef void _redepth(PyObject* node) except *:
    """The depth of ``node`` again: 1 + the deepest op input for op nodes, the
    deepest input for views; leaves keep theirs."""
    cdef Py_ssize_t j, depth = 0, d
    cdef PyObject* kind = _slot(node, N_KIND)
    cdef PyObject* inputs
    cdef PyObject* deps
    if <object>kind == LEAF:
        return
    inputs = _slot(node, N_INPUTS)
    for j in range(len(<object>inputs)):
        d = PyLong_AsSsize_t(<object>_slot(
            _source(PyList_GET_ITEM(<object>inputs, j)) if type(<object>inputs) is list
            else _source(PyTuple_GET_ITEM(<object>inputs, j)), N_DEPTH))
        if d > depth:
            depth = d
    deps = _slot(node, N_DEPS)
    for j in range(PyTuple_GET_SIZE(<object>deps)):
        d = PyLong_AsSsize_t(<object>_slot(PyTuple_GET_ITEM(<object>deps, j), N_DEPTH))
        if d > depth:
            depth = d
    _set_slot(node, N_DEPTH, PyLong_FromSsize_t(depth + 1 if <object>kind == OP else depth))
