# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled hot path of recording: an operator call matched against a frame's trie.

Every operator call of every frame of every sample passes here, so this path
is compiled, typed and allocates little: it reads LazyArray's slots at their
offsets (no attribute lookups), builds the call's key as one tuple, looks it
up in the frame's current trie state and hands out a provisional LazyArray
from a pool.  Anything it does not know (a first call, an array read for the
first time, keywords holding arrays, a changed autograd mode) goes to the
Python methods of ``frames.Frame`` and ``recorder.Recorder``, which learn it.

* :class:`State`: a node of the template trie (``trie.py``);
* :class:`FrameCore`: a frame's recording state and its matched path
  (``Frame.op``, ``push``);
* :class:`RecorderCore`: what the hot path reads of the recorder;
* :class:`Operator`: ``F.<op>`` of the recording namespace;
* :func:`binary`: the arithmetic operators of LazyArray.
"""
import weakref

from ..ir._scan import slot_offset
from ..ir.known import NAN, NEGATIVE_ZERO

from cpython.object cimport PyObject, PyTypeObject
from libc.math cimport signbit
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.dict cimport PyDict_GetItem
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE

cdef extern from "Python.h":
    PyObject* PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems) except NULL
    Py_ssize_t Py_REFCNT(PyObject* o)
    PyObject* PyEval_GetFrame()

# -- LazyArray's slots, read and written at their offsets -----------------------------
cdef object LAZY = None            # the LazyArray class (``bind``)
cdef object NDARRAY = None         # mxnet.nd.NDArray
cdef list MODES = None             # context.MODE_CHANGES
cdef Py_ssize_t OFF_H, OFF_NODE, OFF_IDX, OFF_BASE, OFF_ROWS, OFF_WRITABLE, OFF_EPOCH, OFF_VIEWS
cdef object FLOAT = float
cdef object INT = int
cdef object STR = str


cdef Py_ssize_t _offset(cls, name) except -1:
    return slot_offset(cls, name)


def bind(lazy_class, ndarray_class, mode_changes):
    """Learn where ``lazy_class`` (LazyArray) keeps its slots; the NDArray class
    and the counter of autograd's mode changes (``context.MODE_CHANGES``)."""
    global LAZY, NDARRAY, MODES, OFF_H, OFF_NODE, OFF_IDX, OFF_BASE, OFF_ROWS, OFF_WRITABLE
    global OFF_EPOCH, OFF_VIEWS
    OFF_EPOCH = _offset(lazy_class, "_epoch")
    OFF_VIEWS = _offset(lazy_class, "_views")
    OFF_H = _offset(lazy_class, "_h")
    OFF_NODE = _offset(lazy_class, "_node")
    OFF_IDX = _offset(lazy_class, "_idx")
    OFF_BASE = _offset(lazy_class, "_base")
    OFF_ROWS = _offset(lazy_class, "_rows")
    OFF_WRITABLE = _offset(lazy_class, "writable")
    LAZY, NDARRAY, MODES = lazy_class, ndarray_class, mode_changes


cdef inline PyObject* _peek(object o, Py_ssize_t off):
    """The slot at ``off`` of ``o``, borrowed (NULL when never set)."""
    return (<PyObject**>((<char*><PyObject*>o) + off))[0]


cdef inline object _get(object o, Py_ssize_t off):
    cdef PyObject* p = _peek(o, off)
    if p == NULL:
        return None
    return <object>p


cdef inline void _set(object o, Py_ssize_t off, object value):
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>o) + off)
    cdef PyObject* old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject*>value
    Py_XDECREF(old)


cdef object _fresh_lazy(object node, object idx):
    """A new LazyArray standing for output ``idx`` of ``node``, without ``__init__``."""
    cdef object lazy = <object>PyType_GenericAlloc(<PyTypeObject*>LAZY, 0)
    Py_XDECREF(<PyObject*>lazy)        # PyType_GenericAlloc's reference, now the variable's
    _set(lazy, OFF_H, None)
    _set(lazy, OFF_NODE, node)
    _set(lazy, OFF_IDX, idx)
    _set(lazy, OFF_BASE, None)
    _set(lazy, OFF_ROWS, None)
    _set(lazy, OFF_WRITABLE, True)
    return lazy


def fresh_lazy(node, idx):
    """A new LazyArray for output ``idx`` of ``node`` (``_fresh_lazy``)."""
    return _fresh_lazy(node, idx)


def node_of(lazy):
    """``lazy._node``, read at its offset."""
    return _get(lazy, OFF_NODE)


POOL_SIZE = 4096           # dead provisional LazyArrays kept for reuse, per recorder
MAX_STATES = 200000        # states of one trie before it is dropped and learned anew


def _position(lazy):
    return _get(lazy, OFF_IDX)


# -- graph nodes, made at their slots' offsets -----------------------------------------------
cdef object NODE = None             # ir.graph.Node
cdef object WEAKREF = weakref.ref
cdef dict NO_KWARGS = None          # ir.graph.NO_KWARGS
cdef tuple NODE_SLOTS = ("id", "graph", "kind", "op", "inputs", "args", "kwargs", "out_shapes",
                         "out_dtypes", "sig", "rule", "deps", "depth", "sample", "path",
                         "value", "param", "outs", "meta", "attrs", "info", "at")
cdef Py_ssize_t N_ID, N_GRAPH, N_KIND, N_OP, N_INPUTS, N_ARGS, N_KWARGS, N_SHAPES, N_DTYPES
cdef Py_ssize_t N_SIG, N_RULE, N_DEPS, N_DEPTH, N_SAMPLE, N_PATH, N_VALUE, N_PARAM, N_OUTS
cdef Py_ssize_t N_META, N_ATTRS, N_INFO, N_AT


cdef dict DIM0 = {"dim": 0}         # the keywords of row concatenations (never mutated)


def bind_nodes(node_class, no_kwargs, concat, infos, slot, slots_of,
               Py_ssize_t max_row_concat):
    """Learn where ``ir.graph.Node`` keeps its slots; the OpDef of ``concat``, the
    memo of call analyses (``ir.calls.INFOS``), ``ir.graph.slot`` and ``slots_of``
    and the longest row concatenation made as a view here
    (``recorder.MAX_ROW_CONCAT``)."""
    global CONCAT, INFOS, SLOT, SLOTS_OF, MAX_ROW_CONCAT
    CONCAT, INFOS, SLOT, SLOTS_OF, MAX_ROW_CONCAT = concat, infos, slot, slots_of, max_row_concat
    global NODE, NO_KWARGS, N_ID, N_GRAPH, N_KIND, N_OP, N_INPUTS, N_ARGS, N_KWARGS, N_SHAPES
    global N_DTYPES, N_SIG, N_RULE, N_DEPS, N_DEPTH, N_SAMPLE, N_PATH, N_VALUE, N_PARAM
    global N_OUTS, N_META, N_ATTRS, N_INFO, N_AT
    NODE, NO_KWARGS = node_class, no_kwargs
    (N_ID, N_GRAPH, N_KIND, N_OP, N_INPUTS, N_ARGS, N_KWARGS, N_SHAPES, N_DTYPES, N_SIG,
     N_RULE, N_DEPS, N_DEPTH, N_SAMPLE, N_PATH, N_VALUE, N_PARAM, N_OUTS, N_META, N_ATTRS,
     N_INFO, N_AT) = [_offset(node_class, name) for name in NODE_SLOTS]


cdef object make_node(object graph, list nodes, object kind, object op, object inputs,
                      object args, object kwargs, object info, object sample, object path):
    """A node of ``graph`` for a call whose analysis ``info`` is known, every slot
    set once (as ``ir.graph.analysed_node``); not yet appended to ``nodes``."""
    cdef object node = <object>PyType_GenericAlloc(<PyTypeObject*>NODE, 0)
    Py_XDECREF(<PyObject*>node)
    _set(node, N_ID, len(nodes))
    _set(node, N_GRAPH, graph)
    _set(node, N_KIND, kind)
    _set(node, N_OP, op)
    _set(node, N_INPUTS, inputs)
    _set(node, N_ARGS, args)
    _set(node, N_KWARGS, kwargs)
    _set(node, N_SHAPES, info.out_shapes)
    _set(node, N_DTYPES, info.out_dtypes)
    _set(node, N_SIG, None)
    _set(node, N_RULE, info.rule)
    _set(node, N_DEPS, ())
    _set(node, N_DEPTH, 0)
    _set(node, N_SAMPLE, sample)
    _set(node, N_PATH, path)
    _set(node, N_VALUE, None)
    _set(node, N_PARAM, None)
    _set(node, N_OUTS, None)
    _set(node, N_META, info.meta)
    _set(node, N_ATTRS, info.attrs)
    _set(node, N_INFO, info)
    _set(node, N_AT, None)
    return node


cdef object _held(object node, Py_ssize_t n):
    """LazyArrays of the ``n`` outputs of new ``node``, which holds them (a user's
    values, handed their results when the graph runs): the only one if ``n`` is 1."""
    cdef object lazy
    cdef list outs
    cdef Py_ssize_t k
    if n == 1:
        lazy = _fresh_lazy(node, 0)
        _set(node, N_OUTS, [WEAKREF(lazy)])
        return lazy
    outs = [_fresh_lazy(node, k) for k in range(n)]
    _set(node, N_OUTS, [WEAKREF(lazy) for lazy in outs])
    return outs


cdef object CONCAT = None            # the OpDef of ``concat`` (a row concatenation view)
cdef dict INFOS = None               # ir.calls.INFOS: call shape -> CallInfo
cdef object SLOT = None              # ir.graph.slot
cdef object SLOTS_OF = None          # ir.graph.slots_of
cdef Py_ssize_t MAX_ROW_CONCAT = 0   # recorder.MAX_ROW_CONCAT
cdef tuple DIM0_ITEMS = (("dim", 0),)


cdef object PROGRAM_RECIPE = None    # templates.recipes.ProgramRecipe (``bind_recipes``)
cdef object OPS_RECIPE = None        # templates.recipes.OpsRecipe
cdef object LEAF_VALUE = None        # templates.recipes._leaf_value


def bind_recipes(program_recipe, ops_recipe, leaf_value):
    """Learn the recipe classes whose common cases ``apply_recipe`` runs here,
    and how a template's parameter or constant ref becomes a graph value."""
    global PROGRAM_RECIPE, OPS_RECIPE, LEAF_VALUE
    PROGRAM_RECIPE, OPS_RECIPE, LEAF_VALUE = program_recipe, ops_recipe, leaf_value


cpdef apply_recipe(FrameCore frame, list alive, object recipe):
    """``recipe.apply(frame, alive)``; a program recipe exporting whole outputs,
    whose external values this graph already holds, is applied here
    (``apply_program``) without the Python method."""
    cdef RecorderCore rec
    cdef object graph, origin, owner = frame.rec
    cdef PyObject* hit
    if len(owner.graph.nodes) >= owner.max_pending:
        owner.flush()           # bounded memory, as ``Recorder.graph_op``
    if type(recipe) is PROGRAM_RECIPE:
        rec = frame.rec
        graph = rec.graph
        origin = recipe.origin         # (its moved copies share its external values)
        hit = PyDict_GetItem(graph.externals, id(origin))
        if hit != NULL and graph.mode is not None and (<tuple>hit)[0] is origin \
                and (<tuple>hit)[2] is not None and recipe.whole:
            apply_program(frame, alive, recipe, <tuple>hit)
            return
    elif type(recipe) is OPS_RECIPE:
        apply_ops(frame, alive, recipe)
        return
    recipe.apply(frame, alive)


def apply_ops(FrameCore frame, list alive, object recipe):
    """Record ``recipe``'s calls (a ``templates.OpsRecipe``) for ``frame`` as one
    node each, placed as ``Recorder.place`` places them, and point ``alive``,
    the segment's exported values, at their nodes' outputs."""
    cdef RecorderCore rec = frame.rec
    cdef object graph = rec.graph, node, info, array, src, where, lazy, outs
    cdef list nodes = graph.nodes, made = [], inputs
    cdef dict produced = recipe.produced, vals = frame.vals
    cdef object path = frame.path
    cdef PyObject* hit
    if graph.mode is None:          # the autograd modes the frame's calls ran under
        graph.mode = rec.mode
    for step in recipe.steps:
        inputs = []
        for ref in step.refs:
            if type(ref) is not INT:
                inputs.append(LEAF_VALUE(rec, ref))
                continue
            hit = PyDict_GetItem(produced, ref)
            if hit != NULL:
                where = <object>hit
                inputs.append((made[where[0]], where[1]))
                continue
            array = vals[ref]           # read from outside the segment
            src = _get(array, OFF_NODE) if type(array) is LAZY else None
            if src is not None and getattr(src, "graph", None) is graph:
                inputs.append((src, _get(array, OFF_IDX)))
            else:
                inputs.append(rec.value_of(array))
        info = step.info
        node = make_node(graph, nodes, "op", step.op, inputs, step.args, step.kwargs, info,
                         frame.sample, path + step.path)
        if info.stateful or info.shared_pos:
            rec.place(node, info)
        else:
            _place(node, graph, inputs, info)
        nodes.append(node)
        made.append(node)
    rec.num_recorded += len(made)
    rec.num_calls += len(made)
    for lazy in alive:
        where = produced[_get(lazy, OFF_IDX)]
        node = made[where[0]]
        _set(lazy, OFF_NODE, node)
        _set(lazy, OFF_IDX, where[1])
        outs = _get(node, N_OUTS)
        if outs is None:
            outs = [None] * len(<tuple>_get(node, N_SHAPES))
            _set(node, N_OUTS, outs)
        outs[where[1]] = WEAKREF(lazy)


cdef void _place(object node, object graph, list inputs, object info) except *:
    """``Recorder.place`` for a call that updates no state and has no shared
    inputs: its kind, depth and signature."""
    cdef object depth = 0, d
    for value in inputs:
        d = <object>_peek((<tuple>value)[0], N_DEPTH)
        if d > depth:
            depth = d
    if info.kind == "view":
        _set(node, N_KIND, "view")
        _set(node, N_DEPTH, depth)
        return
    _set(node, N_DEPTH, depth + 1)
    if info.link:
        graph.links.append(node)
    if info.sig is None:
        _set(node, N_SIG, ("alone", graph, _get(node, N_ID)))
    else:
        _set(node, N_SIG, info.sig)


def apply_program(FrameCore frame, list alive, object recipe, tuple found):
    """Record ``recipe``'s program node for ``frame`` and point ``alive``, its
    exported values in order, at the node's outputs (a ``templates.ProgramRecipe``
    exporting whole outputs, with a signature: the common case).

    ``recipe.sources`` says where each of the program's inputs comes from:
    ``(0, position)`` an array the frame read, ``(1, value)`` a constant's
    graph value, ``(2, (args, info), sources)`` those stacked along axis 0 by a
    view.  ``found``: the recipe's ``(recipe, external values, signature,
    depth below)`` in this graph.
    """
    cdef RecorderCore rec = frame.rec
    cdef object graph = rec.graph, node, external = found[1]
    cdef list nodes = graph.nodes, args = [], inputs, outs
    cdef Py_ssize_t depth = found[3], k
    cdef tuple value
    for source in recipe.sources:
        value = _program_input(frame, rec, graph, nodes, source)
        args.append(value)
        if <object>_peek(value[0], N_DEPTH) > depth:
            depth = <object>_peek(value[0], N_DEPTH)
    inputs = [args[k] if from_arg else external[k] for from_arg, k in recipe.order]
    info = recipe.info
    node = make_node(graph, nodes, "op", recipe.op, inputs, (), NO_KWARGS, info,
                     rec.sample, frame.path)
    _set(node, N_DEPTH, depth + 1)
    _set(node, N_SIG, found[2])
    nodes.append(node)
    rec.num_recorded += 1
    rec.num_calls += recipe.num_calls
    outs = [None] * len(info.out_shapes)
    for lazy, export in zip(alive, recipe.exports):
        out = export[0]
        _set(lazy, OFF_NODE, node)
        _set(lazy, OFF_IDX, out)
        outs[out] = WEAKREF(lazy)
    _set(node, N_OUTS, outs)


cdef tuple _program_input(FrameCore frame, RecorderCore rec, object graph, list nodes,
                          tuple source):
    """The graph value ``(node, idx)`` of one of a program's inputs (``apply_program``)."""
    cdef int kind = source[0]
    cdef object array, src, node, value
    cdef list values
    cdef Py_ssize_t depth = 0
    if kind == 0:
        array = frame.vals[source[1]]
        src = _get(array, OFF_NODE) if type(array) is LAZY else None
        if src is not None and getattr(src, "graph", None) is graph:
            return (src, _get(array, OFF_IDX))
        return rec.value_of(array)
    if kind == 1:
        return source[1](rec)
    values = [_program_input(frame, rec, graph, nodes, sub) for sub in source[2]]
    for value in values:
        if <object>_peek(value[0], N_DEPTH) > depth:
            depth = <object>_peek(value[0], N_DEPTH)
    args, info = source[1]
    node = make_node(graph, nodes, "view", CONCAT, values, args, DIM0, info, frame.sample,
                     frame.path)
    _set(node, N_DEPTH, depth)
    nodes.append(node)
    rec.num_recorded += 1
    return (node, 0)


# -- the template trie ------------------------------------------------------------------
cdef class State:
    """A node of the template trie: the calls of a frame so far (see ``trie.py``).

    ``next`` maps an operator call's key to the next state, ``calls`` a
    child-block call's key to a ``Macro``, ``written`` a call as written that
    a pass rewrote to a ``Macro``, ``cuts`` the exports of a cut to the state
    after it.  ``recipes`` caches, per tuple of exported positions, how to put
    the segment ending here into the graph.
    """

    cdef public dict next, calls, written, cuts, recipes
    cdef public object step, usage, counter
    cdef public object seen            # what passes noted at this state (a dict), or None
    cdef public Py_ssize_t depth       # calls from the start of its segment to it
    cdef public object dropped         # a cut point's calls learned before it was one, or None
    cdef public bint single
    cdef public object shape, dtype
    cdef object _parent, _start, _root
    cdef object __weakref__

    def __init__(self, step=None, State parent=None, State start=None, counter=None):
        self.single = step is not None and len(step.info.out_shapes) == 1
        self.shape = self.dtype = None
        if self.single:                 # read on every match: kept at hand
            self.shape, self.dtype = step.info.out_shapes[0], step.info.out_dtypes[0]
        self.next, self.calls, self.written, self.cuts, self.recipes = {}, {}, {}, {}, {}
        self.step = step
        # Links back up the trie are weak, so a trie whose block has gone is
        # freed at once (its states are held from the root down).
        self._parent = None if parent is None else weakref.ref(parent)
        self._start = None if start is None or start is self else weakref.ref(start)
        # (kept: a long loop's path is a chain of states, walked at every call)
        self._root = None if parent is None else weakref.ref(parent.root())
        self.counter = counter if counter is not None else (
            parent.counter if parent is not None else [0])
        self.counter[0] += 1
        self.usage = None               # a root's Usage
        self.seen = None
        self.depth = 0 if start is None or start is self else \
            parent.depth + (step is not None)
        self.dropped = None

    @property
    def parent(self):
        """The state before this one (None at a root)."""
        return None if self._parent is None else self._parent()

    @property
    def start(self):
        """The state where this state's segment began (a root or a cut)."""
        return self if self._start is None else self._start()

    cpdef State root(self):
        """The root of this state's trie."""
        cdef object found
        if self._root is None:
            return self
        found = self._root()
        if found is not None:
            return found
        state = self            # (a root freed while this state is still held)
        while state.parent is not None:
            state = state.parent
        return state

    def steps(self):
        """The learned calls from the start of this state's segment to it, in order."""
        out = []
        state = self
        start = self.start
        while state is not start:
            if state.step is not None:         # None: entering a child-block call
                out.append(state.step)
            state = state.parent
        out.reverse()
        return out


cdef class Macro:
    """A call learned once that stands for several recorded calls: a child
    block's call (``State.calls``) or a call as written that a pass rewrote
    (``State.written``).  Where it leads, the shapes and dtypes of the
    positions it adds, what it returns (positions in place of arrays) and the
    bases of its outputs (``bases.bases_made``)."""

    cdef public State target
    cdef public tuple shapes, dtypes
    cdef public object outputs, simple, bases
    cdef public tuple reads            # (argument, position) of arrays read from outside
    cdef Py_ssize_t single             # offset of a one new value returned, else -1

    def __init__(self, State target, tuple shapes, tuple dtypes, outputs, Py_ssize_t start,
                 bases=None, tuple reads=()):
        self.target = target
        self.reads = reads
        self.shapes, self.dtypes = shapes, dtypes
        self.outputs = outputs
        self.simple = _simple_outputs(outputs, start)
        self.bases = bases
        self.single = self.simple[1] if self.simple is not None and self.simple[0] is None \
            and bases is None else -1


def _simple_outputs(outputs, start):
    """``(None, offset)`` for one new value returned, ``(tuple or list,
    offsets)`` for several distinct new values; None for anything else."""
    if outputs[0] == "pos":
        return (None, outputs[1] - start) if outputs[1] >= start else None
    kind, items = outputs
    if kind not in (tuple, list) or any(item[0] != "pos" for item in items):
        return None
    offsets = [item[1] - start for item in items]
    if min(offsets, default=-1) < 0 or len(set(offsets)) < len(offsets):
        return None
    return kind, offsets


# -- the recorder and its frames ----------------------------------------------------------
cdef class RecorderCore:
    """What the hot path reads of a scope's recorder (``recorder.Recorder``)."""

    cdef public object frame         # the Frame recording now, if any
    cdef public object _mode_seen    # MODE_CHANGES[0] when ``mode`` was read
    cdef public object graph
    cdef public object F             # the recording namespace
    cdef public object path          # block names being recorded, for messages
    cdef public object sample        # index of the current top-level call
    cdef public list lazy_pool       # dead provisional LazyArrays, reused by frames
    cdef public Py_ssize_t depth     # nesting of DynBatchBlock calls
    cdef public Py_ssize_t num_recorded   # nodes made since the last flush
    cdef public Py_ssize_t num_calls      # operator calls recorded (in frames or not)
    cdef public Py_ssize_t max_pending    # pending nodes after which a scope flushes
    cdef public object mode              # autograd's (recording, training) of new calls
    cdef public dict row_views           # (begin, end, shape[1:], dtype) -> (info, kwargs)
    cdef public dict _tokens             # id(block) -> ``Recorder.block_token``, per scope
    cdef public dict _roots              # (id(block), modes, helper) -> trie root, per scope
    cdef public object frames            # whether calls are recorded as frames, once known
    cdef public object rows_token        # marks values this scope's flushes handed out
    cdef public bint closed              # its scope has ended (``Recorder.close``)
    cdef public object forwarding        # the block whose own ``forward`` runs now
    cdef public bint numpy_semantics     # ``npx.set_np()`` was on at the scope's start
    cdef public object innermost         # the innermost Frame open (fallen back or not)

    cdef object root_of(self, object block):
        """``Recorder.frame_root(block)``: this scope's root while the modes hold."""
        cdef PyObject* hit
        if self._mode_seen == MODES[0]:
            hit = PyDict_GetItem(self._roots, (id(block), self.mode, None))
            if hit != NULL and (<State>hit).counter[0] < MAX_STATES:
                return <object>hit
        return self.frame_root(block)

    cdef object params_dict(self, object block):
        """``Recorder.params_of(block)``: its parameters as lazy values, by name."""
        cdef PyObject* hit = PyDict_GetItem(self.graph.param_dicts, id(block))
        if hit != NULL and (<tuple><object>hit)[0] is block:
            return (<tuple><object>hit)[1]
        return self.params_of(block)

    def forwarded(self, object block, tuple args):
        """``DynBatchBlock.forward(block, *args)`` called from the block's own
        ``forward`` (``forwarding``): its ``hybrid_forward`` with the recording
        ``F`` and its parameters' lazy values, in the block's frame."""
        return _hybrid_forward(block, self, args)

    cpdef tuple value_of(self, object x):
        """(node, index) of array ``x`` in the current graph (``Recorder.slow_value_of``
        for anything but a value of this graph or an array to make a leaf of)."""
        cdef object node
        if type(x) is LAZY:
            node = _get(x, OFF_NODE)
            if node is None:
                return (_get(self.leaf(x), OFF_NODE), 0)
            if type(node) is NODE and <object>_peek(node, N_GRAPH) is self.graph:
                return (node, _get(x, OFF_IDX))
        elif type(x) is NDARRAY:
            return (_get(self.leaf(x), OFF_NODE), 0)
        return self.slow_value_of(x)

    cpdef object leaf(self, object array):
        """The LazyArray standing for concrete ``array`` in this graph: found, or rows
        handed out by an earlier flush of this scope (``rows_leaf``); anything else
        is ``Recorder.new_leaf``."""
        cdef object found, lazy, rows
        cdef PyObject* hit = PyDict_GetItem(self.graph.leaf_by_id, id(array))
        if hit != NULL and (<tuple><object>hit)[2] is array:
            found = <object>hit
            if _get(found[1], OFF_NODE) is not None:
                return found[1]
            return self._relazy(found)
        if type(array) is LAZY and _get(array, OFF_H) is None:
            # (A value cut out of its rows has memory of its own, which views
            # eager MXNet made of it may have written: its rows are stale.)
            rows = _get(array, OFF_ROWS)
            if rows is not None:
                lazy = self.rows_leaf(array, rows)
                if lazy is not None:
                    return lazy
        return self.new_leaf(array)

    cdef object rows_leaf(self, object array, tuple rows):
        """A view node of the rows ``array`` holds of a batched output this scope's
        flush handed out (``lazy.Rows``), which a batched step gathers from that
        output (a row view not known yet is analysed by ``Recorder._rows_of``);
        None where ``Recorder.new_leaf`` makes a leaf (another scope's rows,
        literals, a value a backward pass may have freed)."""
        cdef object group = rows[0], graph = self.graph, base, src, shape, dtype, lazy
        cdef object begin, end
        cdef object epoch = _get(array, OFF_EPOCH)
        cdef PyObject* hit
        if group.token is not self.rows_token or group.literal or (
                epoch is not None and (<tuple>epoch)[0][0] != (<tuple>epoch)[1]):
            return None
        base = self.leaf(group.array)
        src = _get(base, OFF_NODE)
        if group.mode[0] and src not in graph.known_leaves:
            # Computed while autograd recorded, and not freed since (the epoch):
            # not a constant, known without asking MXNet for its history.
            graph.known_leaves[src] = False
        shape = (<object>_peek(src, N_SHAPES))[0]
        dtype = (<object>_peek(src, N_DTYPES))[0]
        begin, end = group.bounds[rows[1]]
        hit = PyDict_GetItem(self.row_views, (begin, end, shape[1:], dtype))
        if hit == NULL:
            lazy = self._rows_of(base, begin, end)
        else:
            lazy = _fresh_lazy(self._row_node(graph, graph.nodes, <tuple><object>hit, src, 0), 0)
        _set(lazy, OFF_ROWS, rows)      # read as an array: its rows, sliced (``lazy.Rows``)
        graph.leaf_by_id[id(array)] = (_get(lazy, OFF_NODE), lazy, array)
        return lazy

    cpdef object literal(self, object values):
        """``literals.record(self, values)`` where the graph has a pool of the literal's
        dtype and row shape and its row view is known: the pool's next rows as a
        view node; None where ``literals.record`` decides (a new pool, a flush due,
        changed autograd modes, no context yet)."""
        cdef object graph = self.graph, pool, src, shape, tail, found
        cdef list nodes, parts
        cdef PyObject* hit
        if self.ctx is None or self._mode_seen != MODES[0]:
            return None
        nodes = graph.nodes
        if len(nodes) + 2 >= self.max_pending:
            return None
        shape = values.shape
        tail = shape[1:]
        hit = PyDict_GetItem(graph.literals, (values.dtype.str, tail))
        if hit == NULL:
            return None
        pool = <object>hit
        src = pool[0]
        parts = pool[1]
        begin = (<object>_peek(src, N_SHAPES))[0][0] if parts else 0
        end = begin + shape[0]
        hit = PyDict_GetItem(self.row_views, (begin, end, tail, (<object>_peek(src, N_DTYPES))[0]))
        if hit == NULL:
            return None
        found = <object>hit
        parts.append(values)
        graph.literal_parts[(src, begin)] = values
        _set(src, N_SHAPES, ((end,) + tail,))
        self.num_calls += 1
        return _held(self._row_node(graph, nodes, found, src, 0), 1)

    cdef object _append(self, object graph, list nodes, object kind, object op, object inputs,
                        object args, object kwargs, object info, object depth):
        """A node at ``depth`` of a call whose analysis ``info`` is known, appended to
        ``nodes`` and counted (what ``Recorder.add_node`` does, for the hot paths)."""
        cdef object node
        if graph.mode is None:
            graph.mode = self.mode
        node = make_node(graph, nodes, kind, op, inputs, args, kwargs, info, self.sample,
                         self.path)
        _set(node, N_DEPTH, depth)
        nodes.append(node)
        self.num_recorded += 1
        return node

    cdef object _row_node(self, object graph, list nodes, tuple found, object src, object idx):
        """The view node of rows of output ``idx`` of ``src`` (``found``: the row view's
        ``row_views`` entry)."""
        return self._append(graph, nodes, "view", found[2], [(src, idx)], found[3], found[1],
                            found[0], <object>_peek(src, N_DEPTH))

    cpdef object row_concat(self, object op, tuple args, bint plain=False):
        """``F.concat(*args, dim=0)`` of values of this graph (not of the frame
        recording; with ``plain``, none reshaped) whose call shape is known, or None
        (the caller records it otherwise).

        A node's children's states, stacked: recursive models make one or two
        per tree node, so the view node is made here directly (as in
        ``row_slice``), without the generic ``Recorder.graph_op``."""
        cdef object graph = self.graph, a, src, idx, info
        cdef list nodes = graph.nodes, values = [], shapes = [], dtypes = []
        cdef object depth = 0
        cdef Py_ssize_t n = len(args)
        if n == 0 or n > MAX_ROW_CONCAT or len(nodes) >= self.max_pending \
                or self._mode_seen != MODES[0]:
            return None
        for a in args:
            if type(a) is not LAZY or plain and _get(a, OFF_BASE) is not None:
                return None
            src = _get(a, OFF_NODE)
            if type(src) is not NODE or <object>_peek(src, N_GRAPH) is not graph:
                return None
            idx = _get(a, OFF_IDX)
            values.append((src, idx))
            shapes.append((<object>_peek(src, N_SHAPES))[idx])
            dtypes.append((<object>_peek(src, N_DTYPES))[idx])
            if <object>_peek(src, N_DEPTH) > depth:
                depth = <object>_peek(src, N_DEPTH)
        targs = SLOTS_OF(n)
        info = INFOS.get((op, targs, DIM0_ITEMS, tuple(shapes), tuple(dtypes)))
        if info is None or info.kind != "view":
            return None
        self.num_calls += 1
        return _held(self._append(graph, nodes, "view", op, values, targs, DIM0, info, depth), 1)

    cpdef object graph_call(self, object op, tuple args, dict kwargs):
        """``op(*args, **kwargs)`` recorded outside any frame (a block whose calls are
        recorded one by one) as an op node of the graph, made here when its
        arguments are values of this graph (none reshaped, not all parameters)
        and numbers, its call shape is known and its node needs nothing particular
        (``Recorder.add_node`` and ``place`` do the rest); None where the call
        takes the general path (``Recorder.graph_op``)."""
        cdef object graph = self.graph, a, kind, src, idx, info, node, key, depth = 0
        cdef list nodes = graph.nodes, inputs = [], targs = [], shapes = [], dtypes = []
        cdef Py_ssize_t k
        cdef bint computed = False      # an input not a parameter: not a call on weights
        if self._mode_seen != MODES[0] or len(nodes) >= self.max_pending or graph.weight_nodes:
            return None
        if op.arrays is not None and len(args) > op.arrays:   # attributes given by position
            args, kwargs = op.named(args, kwargs)
        for a in args:
            kind = type(a)
            if kind is LAZY:
                src = _get(a, OFF_NODE)
                if _get(a, OFF_BASE) is not None or type(src) is not NODE \
                        or <object>_peek(src, N_GRAPH) is not graph:
                    return None
                computed = computed or <object>_peek(src, N_PARAM) is None
                idx = _get(a, OFF_IDX)
                targs.append(SLOT(len(inputs)))
                inputs.append((src, idx))
                shapes.append((<object>_peek(src, N_SHAPES))[idx])
                dtypes.append((<object>_peek(src, N_DTYPES))[idx])
                if <object>_peek(src, N_DEPTH) > depth:
                    depth = <object>_peek(src, N_DEPTH)
            elif kind is FLOAT or kind is INT:
                targs.append(a)
            else:
                return None
        if not computed:                # weights alone (or no array): the general path
            return None
        if kwargs:
            if "name" in kwargs:
                kwargs = {name: a for name, a in kwargs.items() if name != "name"}
            for a in kwargs.values():
                if isinstance(a, NDARRAY):
                    return None
        key = (op, tuple(targs), tuple(kwargs.items()) if kwargs else (), tuple(shapes),
               tuple(dtypes))
        try:
            info = INFOS.get(key)
        except TypeError:               # an unhashable constant
            return None
        if info is None or info.kind != "op" or info.stateful or info.sig is None \
                or info.shared_pos and info.low:
            return None
        node = self._append(graph, nodes, "op", op, inputs, key[1], kwargs if kwargs else {},
                            info, depth + 1)
        if info.shared_pos:             # batches with calls sharing the same weights
            _set(node, N_SIG, (info.sig, tuple([
                (<object>_peek(inputs[k][0], N_ID), inputs[k][1]) for k in info.shared_pos])))
        else:
            _set(node, N_SIG, info.sig)
        if info.link:
            graph.links.append(node)
        self.num_calls += 1
        return _held(node, len(info.out_shapes))

    cpdef object row_slice(self, object x, object begin, object end):
        """Rows ``begin:end`` of array ``x`` (``x[i:j]``, ``F.slice_axis(x, axis=0,
        ...)``): a view node of the graph, made here when the rows are in range of
        a value of this graph and their call shape is known; else
        ``Recorder.slow_row_slice``."""
        cdef object graph = self.graph, src, idx, shape, dtype
        cdef list nodes
        cdef PyObject* hit
        if type(begin) is not INT or type(end) is not INT or self._mode_seen != MODES[0]:
            return self.slow_row_slice(x, begin, end)
        if type(x) is LAZY:
            src = _get(x, OFF_NODE)
        else:                       # an outside array, a leaf of this graph already
            hit = PyDict_GetItem(graph.leaf_by_id, id(x))
            if hit == NULL or (<tuple><object>hit)[2] is not x:
                return self.slow_row_slice(x, begin, end)
            x = (<tuple><object>hit)[1]
            src = _get(x, OFF_NODE)
        if src is not None and src is self.frame:
            found = self._frame_rows(<FrameCore>src, x, begin, end)
            return found if found is not None else self.slow_row_slice(x, begin, end)
        if src is None or getattr(src, "graph", None) is not graph:
            return self.slow_row_slice(x, begin, end)
        nodes = graph.nodes
        if len(nodes) >= self.max_pending:
            return self.slow_row_slice(x, begin, end)
        idx = _get(x, OFF_IDX)
        shape = (<object>_peek(src, N_SHAPES))[idx]
        dtype = (<object>_peek(src, N_DTYPES))[idx]
        if not (0 <= begin < end <= shape[0]):
            return self.slow_row_slice(x, begin, end)
        hit = PyDict_GetItem(self.row_views, (begin, end, shape[1:], dtype))
        if hit == NULL:
            return self.slow_row_slice(x, begin, end)
        self.num_calls += 1
        return _held(self._row_node(graph, nodes, <tuple><object>hit, src, idx), 1)

    cdef object _frame_rows(self, FrameCore frame, object x, object begin, object end):
        """Rows ``begin:end`` of ``x``, a value of the recording ``frame``, as the
        frame's call of ``slice_axis`` where the pass of ``passes.SLICES`` would
        leave it one (``rewrite.positions.slice_by_position``: the position met
        before at this template state, at a place in the code whose positions
        are not data); else None (the Python path decides)."""
        cdef object seen = frame.state.seen, idx, shape
        cdef PyObject* hit
        cdef tuple got
        if FRAME_SLICES is None or seen is None or not 0 <= begin < end:
            return None
        passes_list, only, varying, op = FRAME_SLICES
        if len(<list>passes_list) != 1 or (<list>passes_list)[0] is not only:
            return None
        idx = _get(x, OFF_IDX)
        shape = frame.out_shapes[idx]
        if end > shape[0]:
            return None
        hit = PyDict_GetItem(seen, (idx, 0, end - begin))
        if hit == NULL:
            return None
        got = <tuple>hit
        if got[0] != begin or got[1] in varying:
            return None
        return frame.op(op, (x,), {"axis": 0, "begin": begin, "end": end})


cdef object FRAME_SLICES = None     # (passes.SLICES, its pass, varying sites, slice_axis)


def bind_frame_slices(list passes_list, object only, set varying, object slice_op):
    """Learn the passes on slices of frame values (``passes.SLICES``), the one
    whose plain outcome ``RecorderCore.row_slice`` knows (``only``), the places
    whose positions are data (``varying``) and the OpDef of ``slice_axis``."""
    global FRAME_SLICES
    FRAME_SLICES = (passes_list, only, varying, slice_op)


cdef class FrameCore:
    """A frame's recording state (``frames.Frame`` adds what is not on the hot path).

    Values of a frame are numbered by *position*: outputs of its calls, and
    the arrays it reads from outside, numbered when first read.
    """

    cdef public RecorderCore rec
    cdef public State state
    cdef public object block, path, sample, caller, call_start, based
    cdef public list out_shapes, out_dtypes, lazies, pool
    cdef public dict vals, ext
    cdef public bint direct, macro_ok
    cdef public object parent        # the enclosing Frame (fallen back or not), or None

    def __init__(self, RecorderCore rec, State root, block, path):
        # The Python frame that calls the block's ``hybrid_forward`` (``sites.capture``).
        self.caller = id(<object>PyEval_GetFrame())
        self.rec = rec
        self.state = root
        root.usage.frames += 1      # calls of the block (or helper), for ``usage.Usage``
        self.block = block
        self.path = path
        self.sample = rec.sample
        self.out_shapes, self.out_dtypes = [], []
        self.vals = {}              # position -> the outside array read there
        self.ext = {}               # id(outside array) -> its position
        self.lazies = []            # provisional LazyArrays of this frame
        self.pool = rec.lazy_pool   # dead ones, reused (see ``scan``)
        self.direct = False         # fallen back: calls go to the graph directly
        self.macro_ok = True        # no cut since the current child-block trace began
        self.call_start = None      # first position of the child-block call being traced
        self.based = None           # values given a base (``bases.py``), forgotten at scans

    cpdef list scan(self):
        """The frame's provisional values referenced from elsewhere than its list
        (sorted by position), its list emptied.

        The others are dead: nobody can read them any more.  They go to the
        pool (up to ``POOL_SIZE``) to serve as later provisional values:
        making and freeing a LazyArray costs more than a frame's bookkeeping
        of one call.  Bases are dropped first (``bases.forget_bases``): a base
        must not keep alive a value nothing else reads.
        """
        cdef list lazies = self.lazies, pool = self.pool, alive = []
        cdef Py_ssize_t k, n = PyList_GET_SIZE(lazies)
        cdef PyObject* item
        cdef object lazy
        if self.based is not None:
            for lazy in self.based:
                _set(lazy, OFF_BASE, None)
            self.based = None
        for k in range(n):
            item = PyList_GET_ITEM(lazies, k)
            if Py_REFCNT(item) > 1:             # only the list holds a dead one
                alive.append(<object>item)
            elif PyList_GET_SIZE(pool) < POOL_SIZE and _peek(<object>item, OFF_VIEWS) == NULL:
                # (not a view or a base of views: ``aliases`` holds it weakly)
                lazy = <object>item
                _set(lazy, OFF_NODE, None)
                pool.append(lazy)
        self.lazies = []
        if len(alive) > 1:
            alive.sort(key=_position)
        return alive

    cpdef finish(self):
        """Put what the frame recorded into the graph (at the end of its call)."""
        if self.direct:
            return
        cdef list alive = self.scan()
        if not alive:
            return
        cdef tuple positions = tuple([_get(lazy, OFF_IDX) for lazy in alive])
        cdef PyObject* hit = PyDict_GetItem(self.state.recipes, positions)
        if hit == NULL:
            recipe = self.state.recipes[positions] = self.rec.recipe_for(self, positions)
        else:
            recipe = <object>hit
        apply_recipe(self, alive, recipe)

    cpdef object push(self, State nxt):
        """Move to state ``nxt`` (a one-output call); its provisional output."""
        self.state = nxt
        cdef Py_ssize_t pos = len(self.out_shapes)
        self.out_shapes.append(nxt.shape)
        self.out_dtypes.append(nxt.dtype)
        return self._lazy_at(pos)

    cdef object _lazy_at(self, Py_ssize_t pos):
        cdef object lazy
        if self.pool:
            lazy = self.pool.pop()
            _set(lazy, OFF_NODE, self)
            _set(lazy, OFF_IDX, pos)
        else:
            lazy = _fresh_lazy(self, pos)
        self.lazies.append(lazy)
        return lazy

    def new_lazy(self, Py_ssize_t pos):
        """A provisional LazyArray for position ``pos`` (from the pool if it can),
        not yet among the frame's lazies."""
        cdef object lazy
        if self.pool:
            lazy = self.pool.pop()
            _set(lazy, OFF_NODE, self)
            _set(lazy, OFF_IDX, pos)
            return lazy
        return _fresh_lazy(self, pos)

    cpdef object op(self, object op, tuple args, dict kwargs):
        """Record ``op(*args, **kwargs)`` in this frame; its provisional output(s).

        This runs for every operator call of every frame.  A call whose
        arrays are values of this frame, arrays read before, parameters or
        constants, whose other arguments are numbers and whose keywords are
        plain constants, follows the trie edge of its key: ``(op, *refs)``
        without keywords, else ``(op, refs, kwargs items)``.  Anything else,
        and any call met for the first time, goes to ``Frame._op``.
        """
        cdef object a, kind, node, found, value, key, kw
        cdef list items
        cdef State nxt
        cdef Py_ssize_t n = len(args), k
        cdef tuple refs
        cdef list first_reads = None
        cdef bint arrays = False
        cdef PyObject* hit
        cdef dict ext = self.ext
        cdef dict shared
        if kwargs:
            for value in kwargs.values():
                if isinstance(value, NDARRAY):  # its ``==`` records: keep it out of keys
                    return self._op(op, args, kwargs)
            if "name" in kwargs:
                return self._op(op, args, kwargs)
        refs = PyTuple_New(n)
        for k in range(n):
            a = args[k]
            kind = type(a)
            if kind is LAZY:
                arrays = True
                node = _get(a, OFF_NODE)
                if node is self:
                    found = _get(a, OFF_IDX)
                else:
                    hit = PyDict_GetItem(ext, id(a))
                    if hit == NULL:
                        shared = self.rec.graph.shared_items
                        hit = PyDict_GetItem(shared, id(a))
                    if hit != NULL:
                        found = <object>hit
                    else:
                        if not self._plain_output(node):
                            return self._op(op, args, kwargs)
                        # A call reading it is no call on weights: read it below,
                        # once nothing can send the call to ``_op`` any more.
                        if first_reads is None:
                            first_reads = []
                        first_reads.append(k)
                        found = None
            elif kind is FLOAT or kind is INT:
                found = (kind, a)      # a constant (a type never names an array)
            else:
                hit = PyDict_GetItem(ext, id(a))
                if hit == NULL:
                    hit = PyDict_GetItem(self.rec.graph.shared_items, id(a))
                    if hit == NULL:
                        return self._op(op, args, kwargs)
                arrays = True
                found = <object>hit
            Py_INCREF(found)
            PyTuple_SET_ITEM(refs, k, found)
        if not arrays:
            return self._op(op, args, kwargs)
        if first_reads is not None:
            items = list(refs)
            for k in first_reads:
                a = args[k]
                hit = PyDict_GetItem(ext, id(a))
                if hit != NULL:
                    # Read by an earlier argument of this call (``add_n(h, h)``):
                    # its position, so the key tells it from two arrays read.
                    items[k] = <object>hit
                    continue
                found = self._unread(a, _get(a, OFF_NODE))
                if found is not None:       # an operator's output: the next position
                    self._read(a, found)
                else:
                    found = self.ref(a)
                items[k] = found
            refs = tuple(items)
        if kwargs:
            kw = tuple(kwargs.items())
            key = (op, refs, kw)
        else:
            kw = None
            key = (op,) + refs
        hit = PyDict_GetItem(self.state.next, key)     # NULL too for an unhashable key
        if hit == NULL:
            if first_reads is None:         # ``_op`` tells calls on weights apart
                return self._op(op, args, kwargs)
            return self.call(op, args, kwargs, key, refs, kw)
        nxt = <State>hit
        if nxt.single:
            return self.push(nxt)
        return self._outputs(nxt)


    cdef bint _plain_output(self, object node):
        """Whether ``node`` is an operator node of this graph computed from more
        than weights: ``ref`` gives its output the next position."""
        cdef object graph = self.rec.graph
        return node is not None and not isinstance(node, FrameCore) \
            and node.graph is graph and node.kind != "leaf" \
            and node not in graph.weight_nodes

    cdef object _known_ref(self, object a):
        """The key item of outside array ``a`` read before, or of a parameter or
        constant; None for an array not read yet."""
        cdef PyObject* hit = PyDict_GetItem(self.ext, id(a))
        if hit == NULL:
            hit = PyDict_GetItem(self.rec.graph.shared_items, id(a))
            if hit == NULL:
                return None
        return <object>hit

    cdef object ref_fast(self, object a):
        """``Frame.ref(a)`` of an array not of this frame: read before, a parameter
        or constant, or an operator's output or view of the graph read now; the
        rest in Python."""
        cdef object found = self._known_ref(a)
        if found is not None:
            return found
        if type(a) is LAZY:
            found = self._unread(a, _get(a, OFF_NODE))
            if found is None:
                found = self._handed_ref(a)
            if found is not None:
                self._read(a, found)
                return found
        return self.ref(a)

    cpdef object call_block(self, object block, tuple args):
        """A child HybridBlock's call inside this frame whose arguments are all
        arrays: the replay of its first trace on this path (``Frame._replay``), or
        its trace (``Frame._learn_block``); nested arguments go to ``Frame.block_call``."""
        cdef Py_ssize_t n = len(args), start
        cdef tuple refs
        cdef object a, key, kind
        cdef PyObject* hit
        cdef Macro macro
        cdef list made
        for a in args:                      # (before anything is read)
            if not isinstance(a, NDARRAY):
                return self._call_nested(block, args)
        refs = self._refs(args, n)
        key = (self._token(block),) + refs
        hit = PyDict_GetItem(self.state.calls, key)
        if hit == NULL:
            return self._learn_block(block, args, key)
        macro = <Macro>hit
        if macro.simple is None or macro.bases is not None or macro.reads:
            return self._replay(macro, args, refs)
        start = len(self.out_shapes)
        self.out_shapes.extend(macro.shapes)
        self.out_dtypes.extend(macro.dtypes)
        self.state = macro.target
        kind = macro.simple[0]
        if kind is None:
            return self._lazy_at(start + macro.simple[1])
        made = [self._lazy_at(start + offset) for offset in macro.simple[1]]
        return tuple(made) if kind is tuple else made

    cdef tuple _refs(self, object arrays, Py_ssize_t n):
        """The key items of a child-block call's ``n`` arrays, in order."""
        cdef tuple refs = PyTuple_New(n)
        cdef Py_ssize_t k
        cdef object a, found
        for k in range(n):
            a = arrays[k]
            if type(a) is LAZY and _get(a, OFF_NODE) is self:
                found = _get(a, OFF_IDX)
            else:
                found = self.ref_fast(a)
            Py_INCREF(found)
            PyTuple_SET_ITEM(refs, k, found)
        return refs

    cdef object _token(self, object block):
        """``Recorder.block_token``, from the scope's cache when it is there."""
        cdef PyObject* hit = PyDict_GetItem(self.rec._tokens, id(block))
        return <object>hit if hit != NULL else self.rec.block_token(block)

    cdef object _call_nested(self, object block, tuple args):
        """``call_block`` of arguments that are lists or tuples of arrays (a
        recurrent cell's ``[h, c]`` states) or plain constants: the key
        ``Frame.block_call`` gives them, made here; anything else goes there."""
        cdef list arrays = []
        cdef object structure = _structure(args, arrays), key
        cdef tuple refs
        cdef PyObject* hit
        if structure is None:
            return self.block_call(block, args)
        refs = self._refs(arrays, len(arrays))
        key = (self._token(block), structure) + refs
        hit = PyDict_GetItem(self.state.calls, key)
        if hit == NULL:
            return self._learn_block(block, args, key)
        return self._follow(<Macro>hit, arrays, refs)

    cdef object _follow(self, Macro macro, list arrays, tuple refs):
        """``Frame._replay`` of a macro whose outputs reshape nothing (no bases)
        and whose arguments are no reshapes of this frame's values; the rest
        there."""
        cdef Py_ssize_t start, k, n = len(arrays)
        cdef dict given
        cdef object a, ref, base
        cdef tuple read
        if macro.bases is not None or macro.simple is not None:
            return self._replay(macro, arrays, refs)
        for a in arrays:
            if type(a) is LAZY:
                base = _get(a, OFF_BASE)
                if base is not None and (<tuple>base)[1] == MODES[0]:
                    return self._replay(macro, arrays, refs)
        start = len(self.out_shapes)
        self.out_shapes.extend(macro.shapes)
        self.out_dtypes.extend(macro.dtypes)
        self.state = macro.target
        given = {}
        for k in range(n):
            ref = refs[k]
            if type(ref) is INT:
                given[ref] = arrays[k]
        for read in macro.reads:            # arrays the call read from outside first
            a = arrays[<Py_ssize_t>read[0]]
            self.vals[read[1]] = a
            self.ext[id(a)] = read[1]
            given[read[1]] = a
        return self.build_out(macro.outputs, start, given)

    cpdef object build_out(self, tuple obj, Py_ssize_t start, dict made):
        """The outputs of a replayed child-block call, as its ``outputs`` name them
        (``made``: position -> array)."""
        cdef object kind = obj[0], lazy, pos
        cdef list items
        if kind == "v":
            return obj[1]
        if kind == "pos":
            pos = obj[1]
            lazy = made.get(pos)
            if lazy is None:
                if <Py_ssize_t>pos < start:     # an array read from outside
                    return self.vals[pos]
                lazy = made[pos] = self._lazy_at(pos)
            return lazy
        items = [self.build_out(o, start, made) for o in obj[1]]
        return kind(items) if kind is list or kind is tuple else kind(*items)

    cdef void _read(self, object a, tuple item):
        """Give outside array ``a`` the next position (``item``: its key item)."""
        cdef Py_ssize_t pos = len(self.out_shapes)
        self.out_shapes.append(item[1])
        self.out_dtypes.append(item[2])
        self.vals[pos] = a
        self.ext[id(a)] = pos

    cdef object _unread(self, object a, object node):
        """The key item an operator's output or a view of this graph (not a value
        of weights alone) gets when read: ``("x", shape, dtype)``, a view's with
        whether its values are known (a literal's rows, ``literals.key_item``);
        else None."""
        cdef object graph = self.rec.graph
        cdef object idx, kind
        if node is None or getattr(node, "graph", None) is not graph:
            return None
        kind = getattr(node, "kind", None)
        if kind == "leaf" or node.id in graph.derived:
            return None
        idx = _get(a, OFF_IDX)
        if kind == "op":
            return ("x", node.out_shapes[idx], node.out_dtypes[idx])
        if kind == "view":
            return ("x", node.out_shapes[idx], node.out_dtypes[idx],
                    node.inputs[0][0] in graph.literal_leaves)
        return None

    cdef object _handed_ref(self, object a):
        """``_unread`` of LazyArray ``a`` holding rows a flush of this scope handed
        out (``lazy.Rows``), once ``RecorderCore.leaf`` made them a view node of
        this graph; None for any other array."""
        cdef object lazy
        if _get(a, OFF_NODE) is not None or _get(a, OFF_ROWS) is None:
            return None
        lazy = self.rec.leaf(a)
        return self._unread(lazy, _get(lazy, OFF_NODE))

    cpdef object call_written(self, object op, tuple args, dict kwargs):
        """``op(*args, **kwargs)``, a call as written that a pass may rewrite: the
        replay of what it recorded the first time on this path (``Frame.written``
        learns it), without running the passes."""
        cdef Py_ssize_t n = len(args), k, start
        cdef tuple refs = PyTuple_New(n)
        cdef object a, kind, found, key, value, node
        cdef PyObject* hit
        cdef Macro macro
        cdef list shapes
        cdef dict unread = None
        cdef bint arrays = False
        if kwargs:
            for value in kwargs.values():
                if isinstance(value, NDARRAY):
                    return self.written(op, args, kwargs)
            if "name" in kwargs:
                return self.written(op, args, kwargs)
        for k in range(n):
            a = args[k]
            kind = type(a)
            if kind is LAZY:
                node = _get(a, OFF_NODE)
                if node is self:
                    found = _get(a, OFF_IDX)
                    arrays = True
                else:
                    if _get(a, OFF_BASE) is not None:
                        return self.written(op, args, kwargs)
                    found = self._known_ref(a)
                    if found is None:
                        if unread is None:
                            unread = {}
                        hit = PyDict_GetItem(unread, id(a))
                        if hit != NULL:     # an earlier argument (``Frame._written_key``)
                            found = ("again", <object>hit)
                        else:
                            unread[id(a)] = k
                            found = self._unread(a, node)
                            if found is None:
                                found = self._handed_ref(a)
                        if found is None:
                            return self.written(op, args, kwargs)
                    arrays = arrays or type(found) is INT or found[0] == "x"
            elif kind is FLOAT or kind is INT:
                found = (kind, a)
            elif isinstance(a, NDARRAY):
                found = self._known_ref(a)
                if found is None:
                    return self.written(op, args, kwargs)
                arrays = arrays or type(found) is INT
            else:
                return self.written(op, args, kwargs)
            Py_INCREF(found)
            PyTuple_SET_ITEM(refs, k, found)
        if not arrays:
            return self.written(op, args, kwargs)
        key = (op, refs, tuple(kwargs.items())) if kwargs else (op,) + refs
        hit = PyDict_GetItem(self.state.written, key)
        if hit == NULL:
            return self.written(op, args, kwargs)
        macro = <Macro>hit
        if macro.single < 0 and (macro.simple is None or macro.bases is not None):
            return self._replay(macro, args, refs)
        start = len(self.out_shapes)
        self.out_shapes.extend(macro.shapes)
        self.out_dtypes.extend(macro.dtypes)
        self.state = macro.target
        for k, pos in macro.reads:          # arrays the call read from outside first
            a = args[k]
            self.vals[pos] = a
            self.ext[id(a)] = pos
        if macro.single >= 0:
            return self._lazy_at(start + macro.single)
        # Several new values (``F.split``'s list): made here as ``_replay`` would.
        kind = macro.simple[0]
        made = [self._lazy_at(start + offset) for offset in macro.simple[1]]
        return tuple(made) if kind is tuple else made


cdef object _structure(object obj, list arrays):
    """``trie._walk_args``: the structure of nested arguments (arrays numbered
    into ``arrays``), or None where a part is neither an array, a list or tuple
    (not a subclass: ``Frame.block_call`` names those), nor a plain constant."""
    cdef object kind = type(obj), item, inner
    cdef list items
    if isinstance(obj, NDARRAY):
        arrays.append(obj)
        return ("A", len(arrays) - 1)
    if kind is list or kind is tuple:
        items = []
        for item in obj:
            inner = _structure(item, arrays)
            if inner is None:
                return None
            items.append(inner)
        return ("list" if kind is list else "tuple", tuple(items))
    if kind is FLOAT:                   # -0.0 told from 0.0, as recorded scalars are
        return ("C", kind, _scalar(obj))
    if kind is INT or kind is bool or kind is str or obj is None:
        return ("C", kind, obj)
    return None


# -- the recording F ------------------------------------------------------------------------
cpdef dict typed_attributes(object op, dict kwargs):
    """``kwargs``, or ``op.parsed(kwargs)`` where an attribute MXNet parses is
    written as a string (``transpose_b="False"``; a ``name`` is no such one)."""
    cdef object typed = op.typed
    cdef object name, value
    if typed is None:
        return kwargs
    for name, value in kwargs.items():
        if type(value) is STR and name in <dict>typed:
            return op.parsed(kwargs)
    return kwargs


cdef class Operator:
    """``F.<op>`` of the recording namespace: a call as written, to the recorder.

    In a frame, with autograd's modes unchanged, an operator that no pass
    rewrites, called on values without bases, goes straight to the frame's
    trie (``FrameCore.op``); one that a pass may rewrite (its operator's
    passes, or those of calls reading a reshaped value of the frame) replays
    what it recorded the first time on the frame's path
    (``FrameCore.call_written``); anything else goes to ``Recorder.record``.
    """

    cdef RecorderCore rec
    cdef object record
    cdef public object op
    cdef public object __name__
    cdef bint plain                  # no pass rewrites its calls
    cdef object rewrites             # else which calls a pass may rewrite (or None: any)
    cdef int form                    # views along axis 0: 1 slice_axis, 2 concat
    cdef Py_ssize_t arrays           # array arguments before attributes (-1: any)
    cdef object typed                # attributes whose strings MXNet parses (``OpDef.typed``)

    def __init__(self, RecorderCore rec, op, name, object plain):
        """``plain``: ``passes.applies`` of the operator (True, False or a test)."""
        self.rec = rec
        self.record = rec.record
        self.op = op
        self.__name__ = name
        self.plain = plain is True
        self.rewrites = plain if callable(plain) else None
        self.form = 1 if op.name == "slice_axis" else 2 if op.name in ("concat", "Concat") \
            else 0
        self.arrays = -1 if op.arrays is None else op.arrays
        self.typed = op.typed

    def __call__(self, *args, **kwargs):
        cdef RecorderCore rec = self.rec
        cdef object frame = rec.frame
        cdef object a
        cdef PyObject* base
        if rec.closed:          # kept by a closure or generator past its scope's end
            return rec.call_after_close(self.op, self.__name__, args, kwargs)
        if kwargs and self.typed is not None:   # ``transpose_b="False"``: rules read values
            kwargs = typed_attributes(self.op, kwargs)
        if kwargs and kwargs.get("out") is not None:
            # Written into an array of the user's: what ``mx.nd`` does with ``out=``
            # (its inputs read first, ``namespace._recording_invoke``).
            return self.op.nd_fn(*args, **kwargs)
        if frame is None and self.form == 0 and (self.plain or self.rewrites is not None
                                                 and not self.rewrites(args, kwargs)):
            a = rec.graph_call(self.op, args, kwargs)     # a block recorded call by call
            if a is not None:
                return a
        if frame is None or rec._mode_seen != MODES[0] or 0 <= self.arrays < len(args):
            return self.record(self.op, args, kwargs)
        if self.form == 1 and len(args) == 1 and len(kwargs) == 3 \
                and kwargs.get("axis", None) == 0 and type(kwargs.get("begin", None)) is INT \
                and type(kwargs.get("end", None)) is INT:
            return rec.row_slice(args[0], kwargs["begin"], kwargs["end"])
        if self.form == 2 and len(kwargs) == 1 and type(kwargs.get("dim", None)) is INT \
                and kwargs["dim"] == 0:
            # Of values outside the frame (children's states): a view of the graph.
            a = rec.row_concat(self.op, args, True)
            if a is not None:
                return a
        if not self.plain:
            return (<FrameCore>frame).call_written(self.op, args, kwargs)
        for a in args:
            if type(a) is LAZY:
                base = _peek(a, OFF_BASE)
                if base != NULL and <object>base is not None:
                    if _get(a, OFF_NODE) is frame:
                        # A pass of ``passes.ON_BASES`` may rewrite it: what it
                        # recorded on this path is replayed (``Frame.written``).
                        return (<FrameCore>frame).call_written(self.op, args, kwargs)
                    return self.record(self.op, args, kwargs)
        return (<FrameCore>frame).op(self.op, args, kwargs)


# -- LazyArray's arithmetic ------------------------------------------------------------------
cdef object _scalar(object other):
    """``float(other)``, or ``NEGATIVE_ZERO`` for ``-0.0`` (``ir.known.NegativeZero``),
    ``NAN`` for a NaN (``ir.known.exact_scalar``)."""
    cdef double value = float(other)
    if value == 0.0 and signbit(value):
        return NEGATIVE_ZERO
    if value != value:
        return NAN
    return value


def binary_method(fn, aop, sop, bint reflected, tls, on_weights):
    """``LazyArray.__add__`` and its kind: ``x op y`` (or ``y op x``, ``reflected``).

    Inside a frame, with a number or another array without a base, the call
    is keyed as ``FrameCore.op`` would key it and follows the frame's trie;
    anything else goes through ``fn`` (the recording ``F``'s helper), which
    also runs it eagerly outside a scope.  ``aop`` and ``sop`` are the
    operators of an array and of a number on the other side; ``on_weights``
    says whether the call reads weights only (recorded once per graph).
    """
    def method(self, other):
        cdef object rec_obj = tls.recorder
        cdef RecorderCore rec
        cdef object frame, mine, theirs, kind, number
        if rec_obj is None or _get(self, OFF_BASE) is not None:
            return fn(other, self) if reflected else fn(self, other)
        rec = <RecorderCore>rec_obj
        frame = rec.frame
        if frame is None and rec._mode_seen == MODES[0]:      # recorded call by call
            kind = type(other)
            if kind is FLOAT or kind is INT:
                mine = rec.graph_call(sop, (self, _scalar(other)), {})
            elif kind is LAZY and not reflected:
                mine = rec.graph_call(aop, (self, other), {})
            else:
                mine = None
            if mine is not None:
                return mine
        if frame is None or rec._mode_seen != MODES[0]:
            return fn(other, self) if reflected else fn(self, other)
        kind = type(other)
        if not (kind is FLOAT or kind is INT or kind is LAZY and not reflected
                and _get(other, OFF_BASE) is None):
            # Before ``self`` is read: a first read's key item (its shape) must
            # enter the key of the call that reads it, which the slow path makes.
            return fn(other, self) if reflected else fn(self, other)
        if _get(self, OFF_NODE) is frame:
            mine = _get(self, OFF_IDX)
        elif on_weights(rec, frame, self, other):
            return fn(other, self) if reflected else fn(self, other)
        else:
            mine = (<FrameCore>frame).ref_fast(self)
        if kind is FLOAT or kind is INT:
            number = _scalar(other)
            return _arithmetic_step(frame, sop, (self, number), (mine, (FLOAT, number)))
        if _get(other, OFF_NODE) is frame:
            theirs = _get(other, OFF_IDX)
        else:
            theirs = (<FrameCore>frame).ref_fast(other)
        return _arithmetic_step(frame, aop, (self, other), (mine, theirs))
    return method


cdef object _arithmetic_step(object frame, object op, tuple args, tuple refs):
    """The trie edge of ``op`` on ``refs`` from ``frame``'s state (learned on a miss)."""
    cdef tuple key = (op,) + refs
    cdef PyObject* hit = PyDict_GetItem((<FrameCore>frame).state.next, key)
    cdef State nxt
    if hit != NULL:
        nxt = <State>hit
        if nxt.single:
            return (<FrameCore>frame).push(nxt)
    return frame.call(op, args, {}, key, refs, None)


# -- block calls ---------------------------------------------------------------------------
cdef object TLS = None             # context.TLS
cdef dict KINDS = None             # dispatch._KINDS: block class -> how it is recorded
cdef object KIND_OF = None         # dispatch._kind
cdef object ORIGINAL_CALL = None   # Gluon's Block.__call__
cdef object DISPATCH = None        # dispatch.dispatch: calls of other blocks
cdef object TOP_CALL = None        # dispatch.record_call: top-level calls
cdef object FRAME = None           # frames.Frame
cdef object IRREGULAR = None       # dispatch.tell_irregular
cdef object WATCH = None           # recursion.watch_closures
cdef object STOP = None            # recursion.stop_watching
cdef object NOT_RECORDED = None    # frames.NOT_RECORDED
cdef dict WRAPPERS = None          # kind -> the ``forward`` that only wraps ``hybrid_forward``
cdef object FORWARD = None         # DynBatchBlock.forward (``bind_forward``)
cdef object ND = None              # mx.nd
cdef object ASKS = None            # dispatch.asks_namespace
cdef dict ASKED = None             # class -> (its hybrid_forward, whether its code asks)


def bind_forward(forward, nd, dict asked):
    """``DynBatchBlock.forward``: a block whose ``forward`` is another (replaced on
    the block or its class since) runs it inside a scope, as eagerly; and
    ``mx.nd``, the ``F`` of a block whose code asks ``F is mx.nd``, which
    ``asked`` knows per class (``DynBatchBlock._asks_namespace``)."""
    global FORWARD, ND, ASKED
    FORWARD, ND, ASKED = forward, nd, asked


def bind_dispatch(tls, kinds, kind_of, original_call, dispatch, top_call, frame_class,
                  irregular, watch, stop, not_recorded, wrappers, asks):
    """What the compiled ``Block.__call__`` needs of ``dispatch.py`` and its neighbours."""
    global TLS, KINDS, KIND_OF, ORIGINAL_CALL, DISPATCH, TOP_CALL, FRAME, IRREGULAR
    global WATCH, STOP, NOT_RECORDED, WRAPPERS, ASKS
    NOT_RECORDED, WRAPPERS, ASKS = not_recorded, wrappers, asks
    TLS, KINDS, KIND_OF, ORIGINAL_CALL = tls, kinds, kind_of, original_call
    DISPATCH, TOP_CALL, FRAME, IRREGULAR, WATCH, STOP = (dispatch, top_call, frame_class,
                                                         irregular, watch, stop)


def dispatching_call(self, *args):
    """``Block.__call__`` inside a batching scope: a DynBatchBlock's call below the
    top level is a frame (``record_frame``); top-level calls and other blocks go
    to ``dispatch.py``.  Outside a scope, Gluon's own."""
    cdef object rec = TLS.recorder
    cdef object cls, kind, frame, out
    cdef PyObject* hit
    if rec is None:
        return ORIGINAL_CALL(self, *args)
    if (<RecorderCore>rec)._mode_seen != MODES[0]:
        # Autograd's modes changed (``predict_mode()``, ``pause()`` around this
        # call): the frame falls back and the calls of the old modes go first,
        # before a template learned under other modes could be replayed.
        rec.sync_mode()
    if (<RecorderCore>rec).numpy_semantics:
        # Under numpy semantics Gluon's layers and the model's ``F.np`` calls take
        # ``mx.np`` arrays only, not the recorder's values: calls run as eagerly.
        return ORIGINAL_CALL(self, *args)
    cls = type(self)
    hit = PyDict_GetItem(KINDS, cls)
    kind = <object>hit if hit != NULL else KIND_OF(cls)
    if kind == "dynbatch":
        if (<RecorderCore>rec).depth > 0:
            return record_frame(self, <RecorderCore>rec, args)
        return TOP_CALL(self, rec, args)
    if (kind == "traced" or kind == "cell") and (
            "forward" in self.__dict__ or getattr(cls, "forward") is not WRAPPERS[kind]
            or "hybrid_forward" in self.__dict__ and ASKS(self.__dict__["hybrid_forward"])):
        # Its ``forward`` replaced since (on the block, or its class), or its
        # ``hybrid_forward`` on the block by code asking ``F is mx.nd``.
        kind = "opaque"
    frame = (<RecorderCore>rec).frame
    if (kind == "traced" or kind == "cell") and frame is not None \
            and not self._forward_pre_hooks and not self._forward_hooks:
        if kind == "cell":
            # As RecurrentCell.forward counts its calls (past Block.__setattr__).
            counter = self.__dict__
            counter["_counter"] = counter["_counter"] + 1
            kind = "traced"
        out = (<FrameCore>frame).call_block(self, args)
        if out is not NOT_RECORDED:
            return out
    return DISPATCH(self, rec, kind, args)


cpdef object record_frame(object block, RecorderCore rec, tuple args):
    """One call of DynBatchBlock ``block`` inside a scope: a frame (``frames.py``)
    around its ``hybrid_forward``, which runs with the recording ``F``; the
    block's forward hooks around it, as ``Block.__call__`` runs them."""
    cdef object hooks = block._forward_pre_hooks, out
    if hooks:
        for hook in list(hooks.values()):
            hook(block, args)
    out = _frame_call(block, rec, args)
    hooks = block._forward_hooks
    if hooks:
        for hook in list(hooks.values()):
            hook(block, args, out)
    return out


cdef object _hybrid_forward(object block, RecorderCore rec, tuple args):
    # Code asking ``F is mx.nd`` is given ``mx.nd``, whose operators on pending
    # values are recorded too (through ``namespace._recording_invoke``).
    cdef object cls = type(block), F = rec.F
    cdef PyObject* hit = PyDict_GetItem(ASKED, cls)
    if hit == NULL or (<tuple><object>hit)[0] is not getattr(cls, "hybrid_forward") \
            or "hybrid_forward" in block.__dict__:
        if block._asks_namespace:
            F = ND
    elif (<tuple><object>hit)[1]:
        F = ND
    if not block._reg_params:   # a recursive model's own block often has none
        return block.hybrid_forward(F, *args)
    return block.hybrid_forward(F, *args, **rec.params_dict(block))


cdef object _frame_call(object block, RecorderCore rec, tuple args):
    cdef object outer_path = rec.path, outer_frame = rec.frame, outer_innermost = rec.innermost
    cdef object frame = None, root, out, tracer = None, outer_forwarding
    rec.depth += 1
    rec.path = outer_path + (block._name,)
    try:
        if rec.frames is True or rec.frames is None and rec.frames_on():
            root = rec.root_of(block)
            if not root.usage.irregular:
                frame = FRAME(rec, root, block, rec.path)
                (<FrameCore>frame).parent = outer_innermost
                rec.innermost = frame
            else:
                IRREGULAR(block, root)
            if block._closure_codes:
                tracer = WATCH(block, block._closure_codes)
        rec.frame = frame
        if "forward" in block.__dict__ or getattr(type(block), "forward") is not FORWARD:
            # Its own ``forward`` (its class's, or one set on the block) runs, as
            # eagerly; ``DynBatchBlock.forward`` called from it runs
            # ``hybrid_forward`` here (``forwarded``).
            outer_forwarding, rec.forwarding = rec.forwarding, block
            try:
                out = block.forward(*args)
            finally:
                rec.forwarding = outer_forwarding
        else:
            out = _hybrid_forward(block, rec, args)
        if frame is not None:
            (<FrameCore>frame).finish()     # ``out`` holds what the call returns
        return out
    finally:
        if tracer is not None:
            STOP(tracer)
        rec.frame = outer_frame
        rec.innermost = outer_innermost
        rec.depth -= 1
        rec.path = outer_path


def getitem_method(slow, note):
    """``LazyArray.__getitem__``: ``x[i:j]`` of a pending value without a base, rows
    of it in range, is a row view (``RecorderCore.row_slice``), which
    ``note(x, view, ("index", key))`` keeps when ``x`` is an operator's value (eager's
    view shares its memory: ``aliases``); anything else goes to ``slow``
    (``arithmetic._getitem``), also outside a scope."""
    def getitem(self, key):
        cdef object rec = TLS.recorder, node, shape, begin, end
        if rec is None or type(key) is not slice:
            return slow(self, key)
        begin, end = key.start, key.stop
        node = _get(self, OFF_NODE)
        if key.step is not None or type(begin) is not INT or type(end) is not INT \
                or node is None or _get(self, OFF_BASE) is not None:
            return slow(self, key)
        shape = node.out_shapes[_get(self, OFF_IDX)]
        if not (0 <= begin < end <= shape[0]) or (begin == 0 and end == shape[0]):
            return slow(self, key)
        if getattr(node, "kind", None) == "leaf":
            return (<RecorderCore>rec).row_slice(self, begin, end)
        return note(self, (<RecorderCore>rec).row_slice(self, begin, end), ("index", key))
    return getitem
