"""LazyArray: the value a call returns inside a batching scope.

A LazyArray is an ``mx.nd.NDArray`` whose handle is filled in when the
recorded graph that produces it has run.  Until then it knows its shape,
dtype and context, and the recorder intercepts arithmetic, indexing and
fluent methods on it (and ``mx.nd`` operators called on it directly, see
``namespace.py``).  Anything else that needs its data (``asnumpy``, an
operator writing to ``out=``, ``backward``) reaches for ``handle``, which
first runs what is pending.
"""
import contextlib
import ctypes
import threading
import weakref

import numpy as np
from mxnet import autograd, nd
from mxnet.base import _LIB, NDArrayHandle, check_call

from ..errors import BatchingError
from ..ir.known import autograd_symbol, device_array, row_slice

def check_dispatch(ndarray_class):
    """Raise ImportError when MXNet dispatches operators through its own Cython
    modules (``mxnet._cy3``, used when present: source builds).

    That dispatch reads an NDArray's C handle field directly, never the Python
    ``handle`` property through which a LazyArray is computed when first read:
    a pending value would reach MXNet as a NULL handle.
    """
    modules = [klass.__module__ for klass in ndarray_class.__mro__]
    if any(module.startswith("mxnet._cy") for module in modules):
        raise ImportError(
            "gluon_dynbatch needs MXNet's ctypes operator dispatch, but this MXNet "
            "dispatches through its Cython modules (%s). Set MXNET_ENABLE_CYTHON=0 in the "
            "environment before importing mxnet (it changes nothing in results)."
            % ", ".join(m for m in modules if m.startswith("mxnet._cy")))


check_dispatch(nd.NDArray)

# Backward passes that freed their graph so far (``retain_graph=False``), per
# thread (autograd's graphs are each thread's own), counted by context.py's
# wrappers of MXNet's backward functions.
_PASSES = threading.local()


def _passes():
    """This thread's count of graph-freeing backward passes, a one-item list."""
    found = getattr(_PASSES, "count", None)
    if found is None:
        found = _PASSES.count = [0]
    return found


def backward_ran():
    """Count a graph-freeing backward pass of this thread."""
    _passes()[0] += 1


def has_history(array):
    """Whether autograd still holds the graph that computed ``array``: an array a
    backward pass went through (without ``retain_graph``) is a constant to it
    from then on, one a pass did not reach keeps its graph."""
    return autograd_symbol(array) is not None


def constants_if_freed(arrays):
    """``arrays`` with every LazyArray whose graph a backward pass freed taken as
    a constant (``detach``), as eager MXNet takes such an array.

    A value cut out of a batched array is a row of it in autograd's graph: a
    pass that freed the array but not the row (the row was not on the loss's
    path) would leave a recorded row whose input MXNet no longer knows, and
    the next backward pass through it would fail.
    """
    return [a.detach() if type(a) is LazyArray and a.history_freed() else a
            for a in arrays]


_FREED = -1     # an epoch's count once its value is known to be freed


_SET_ASIDE = threading.local()


@contextlib.contextmanager
def set_aside():
    """While a user's ``autograd.Function`` runs with the recorder set aside, a
    value still pending that it reads raises (a read would let other samples
    record with no recorder)."""
    before = getattr(_SET_ASIDE, "on", False)
    _SET_ASIDE.on = True
    try:
        yield
    finally:
        _SET_ASIDE.on = before


def given_array(array):
    """The array the user gave that ``array`` stands for, when it is a sample's
    input (a leaf of a recorded graph) and that array has a gradient
    (``x.attach_grad()`` before the scope), else ``array``.

    Batched steps read the given array itself, so autograd reaches it as
    eager's calls do (``autograd.grad(out, [x])`` inside a sample).
    """
    if type(array) is not LazyArray:
        return array
    given = getattr(array, "_given", None)
    return array if not isinstance(given, nd.NDArray) or given.grad is None else given


def shallow_copy(value):
    """A new NDArray handle of ``value``'s array and autograd entry (its memory,
    its history, its gradient)."""
    handle = NDArrayHandle()
    check_call(_LIB.MXShallowCopyNDArray(value.handle, ctypes.byref(handle)))
    return nd.NDArray(handle)


def epoch_stamp():
    """What a value computed now is stamped with (``LazyArray.history_freed``):
    its thread's count of backward passes, and the count now."""
    count = _passes()
    return (count, count[0])


ATTACH_TO_GIVEN = None
"""``context.attach_to_given``: ``attach_grad`` of a sample's input standing for an
array the caller gave gives that array the gradient (set when installed)."""


class LazyArray(nd.NDArray):
    """An NDArray produced by a recorded call, materialised on demand."""

    # Slots, not a __dict__: a batch makes thousands of LazyArrays.
    # ``_epoch``: ``epoch_stamp()`` when the value was computed (see ``history_freed``).
    # ``_base``: (the value this one reshapes, autograd's mode count), see reshapes.py.
    # ``_rows``: (Rows, index) of a value a flush handed out as rows of a batched
    # output (``run.lowering.Lowering.deliver``), or of their view in a later graph.
    # ``_views``: views of this value eager would make share its memory (aliases.py).
    # ``_given``: the array with a gradient the user gave that a leaf stands for
    # (``given_array``), set by ``Recorder.new_leaf``.
    __slots__ = ("_h", "_node", "_idx", "_epoch", "_base", "_rows", "_views", "_given",
                 "__weakref__")

    def __init__(self, node=None, index=0, handle=None, writable=True):
        # pylint: disable=super-init-not-called
        # ``handle``: NDArray methods that make a view of a computed value
        # (``reshape``, basic indexing) call ``self.__class__(handle=...)``.
        self._h = handle
        self._node = node
        self._idx = index
        self._base = None
        self._rows = None
        self.writable = writable
        if handle is not None:
            self._epoch = epoch_stamp()

    # -- the handle: materialise on first use --------------------------------
    @property
    def handle(self):
        h = self._h
        if h is None:
            h = self._materialize()
        return h

    @handle.setter
    def handle(self, value):
        self._h = value

    def _materialize(self):
        self._compute()
        rows = self._rows
        if self._h is None and rows is not None:
            if self._node is None:          # handed out by a flush, not cut out yet
                rows[0].cut_out()
            if self._h is None:             # a value's rows in a later graph (``Recorder.leaf``)
                piece = rows[0].slice(rows[1])
                self._h, piece.handle = piece.handle, None
                self._epoch = epoch_stamp()
        h = self._h
        if h is None:
            raise BatchingError("internal error: value not produced by its flush")
        return h

    def _compute(self):
        """Run what computes this value, unless it has run: its flush, or the
        copy of an input wrapped for recording."""
        node = self._node
        if self._h is not None or self._rows is not None:
            return
        if node is None:
            raise BatchingError("this LazyArray was never given a value")
        graph = node.graph
        if node.kind == "leaf":
            # An input wrapped for recording, used as a plain array: copy it.
            source = node.value if node.value is not None else node.param.data(graph.ctx)
            self._set_result(nd.identity(source))
            return
        if graph.error is not None:
            raise BatchingError(
                "this value comes from a batching scope that failed (%s); "
                "record it again in a new scope" % graph.error)
        if getattr(_SET_ASIDE, "on", False):
            raise BatchingError(
                "an autograd.Function's code read a value of the scope that other samples' "
                "calls recorded after its sample's last read; give it to the Function as an "
                "input, or compute it in the sample before the call")
        graph.read_fn()

    def asnumpy(self):
        """The values as a numpy array (``NDArray.asnumpy``).

        A value that a flush handed out as rows of a batched output is copied
        from that output's host copy, made once for all its values: samples
        that each read their own score cost one copy from MXNet, not one each.
        """
        if type(self) is not LazyArray:     # a placeholder (``tasks.Pending``)
            return nd.NDArray.asnumpy(self)
        self._compute()
        rows = self._rows
        if self._h is None and self._node is None and rows is not None:
            return rows[0].host_rows(rows[1])
        return nd.NDArray.asnumpy(self)

    def attach_grad(self, grad_req="write", stype=None):
        """``NDArray.attach_grad`` on the computed value, which from then on is an
        array of its own (a variable of autograd: ``x = h.detach();
        x.attach_grad()`` for a gradient inside a sample): later graphs read it
        as such, not as rows of the batched output that computed it."""
        if ATTACH_TO_GIVEN is not None and ATTACH_TO_GIVEN(self, grad_req, stype):
            return
        self.own_array()
        nd.NDArray.attach_grad(self, grad_req, stype)    # (``context._attach_grad``)

    def own_array(self):
        """Compute this value as an array of its own, not rows of a batched
        output (before it is made a variable of autograd)."""
        self._materialize()
        self._rows = None

    @property
    def grad(self):
        """``NDArray.grad``; of a sample's input that stands for an array with a
        gradient (``x.attach_grad()`` before the scope), a copy of that array's
        gradient as it is now: calls reading it run later, after other
        samples' passes may have written it (an array all samples share)."""
        given = getattr(self, "_given", None)
        if given is not None and not isinstance(given, nd.NDArray):
            # A parameter's value a child's code reads (``gate.asscalar()``):
            # its gradient, as eager's ``param.data().grad``.
            if getattr(given, "grad_req", "null") == "null":
                return None
            return given.grad(self.context).copy()
        given = given_array(self)
        if given is self:
            return nd.NDArray.grad.fget(self)
        grad = given.grad
        return None if grad is None else grad.copy()

    def _set_result(self, array):
        """Take over ``array``'s handle (and so its autograd history)."""
        self._h = array.handle
        array.handle = None
        self._node = None
        self._rows = None
        self._epoch = epoch_stamp()

    def history_freed(self):
        """Whether a backward pass freed the graph that computed this value.

        A computed LazyArray is cut from a batched array of its flush; once
        a backward pass has run through that array (without ``retain_graph``)
        MXNet has freed its history, and the value must be used as a
        constant, as eager MXNet uses an array whose graph was freed.  A
        pass that did not reach it (a GAN's critic step on detached values)
        leaves its history, and gradients flow through it as eagerly.  Only
        values computed before a graph-freeing pass are asked MXNet.
        """
        epoch = getattr(self, "_epoch", None)
        if epoch is None or epoch[0][0] == epoch[1]:
            return False                # no pass since it was computed (or asked)
        if epoch[1] == _FREED:
            return True
        rows = self._rows
        freed = rows is not None and rows[0].history_freed() or (
            self._h is not None and not has_history(self))
        # Remembered: freed for good, or kept until the next pass.
        self._epoch = (epoch[0], _FREED if freed else epoch[0][0])
        return freed

    @property
    def is_pending(self):
        """True while the value has not been computed yet."""
        return self._h is None and (self._node is not None or self._rows is None)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None:
            check_call(_LIB.MXNDArrayFree(h))

    # -- metadata known without running ---------------------------------------
    @property
    def shape(self):
        node = self._node
        if node is not None:
            return node.out_shapes[self._idx]
        rows = self._rows
        if rows is not None:        # handed out by a flush: its rows say (no ctypes call)
            begin, end = rows[0].bounds[rows[1]]
            return (end - begin,) + rows[0].tail
        return nd.NDArray.shape.fget(self)

    @property
    def dtype(self):
        node = self._node
        if node is not None:
            return node.out_dtypes[self._idx]
        rows = self._rows
        if rows is not None:
            return rows[0].dtype
        return nd.NDArray.dtype.fget(self)

    @property
    def context(self):
        node = self._node
        if node is not None:
            return node.graph.ctx
        return nd.NDArray.context.fget(self)

    ctx = context

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def stype(self):
        node = self._node
        if node is not None:        # computed values are dense; an input as given
            value = node.value if node.kind == "leaf" else None
            return "default" if value is None else value.stype
        return nd.NDArray.stype.fget(self)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        # Debuggers and containers show a pending value without running anything.
        if self.is_pending:
            return "<LazyArray %s %s, pending>" % (
                "x".join(str(s) for s in self.shape), self.context)
        return self._as_ndarray_text()

    def __str__(self):
        """``print(x)`` shows the values, as for an NDArray: a read (what is pending runs)."""
        self.handle     # pylint: disable=pointless-statement
        return self._as_ndarray_text()

    def _as_ndarray_text(self):
        """``repr`` of an NDArray of these values: printed as eager code prints them."""
        return "\n%s\n<NDArray %s @%s>" % (str(self.asnumpy()),
                                            "x".join(str(s) for s in self.shape), self.context)

    __hash__ = nd.NDArray.__hash__

    def __reduce__(self):
        return nd.NDArray.__reduce__(self)


def output_of(node, idx):
    """The LazyArray of output ``idx`` of graph node ``node``: the one already made
    if it is alive.

    One value has one LazyArray, as in eager code a value has one NDArray: a
    call returning the same array twice returns one object, and liveness
    (``Graph.live_and_needed``) sees every holder.
    """
    outs = node.outs
    if outs is None:
        outs = node.outs = [None] * len(node.out_shapes)
    ref = outs[idx]
    lazy = ref() if ref is not None else None
    if lazy is None or lazy._node is not node:
        lazy = LazyArray(node, idx)
        outs[idx] = weakref.ref(lazy)
    return lazy


class Rows:
    """A batched output of a flush (or a literal pool) whose rows it handed out
    to LazyArrays.

    Each of them holds ``(rows, k)`` in ``_rows``: a later flush of the same
    scope that reads one takes its rows of this array (``Recorder.leaf``), so a
    batched step gathers every sample's rows from one array, not from as many
    pieces.  The values are cut out of the array only when one is used as an
    NDArray (``cut_out``), and read from one host copy (``host_rows``).

    Parameters
    ----------
    array : NDArray
        The batched output.
    counts : list of int
        Rows of each value, in order.
    mode : tuple
        Autograd's (recording, training) while the flush ran.
    token : object
        The flushing scope's ``Recorder.rows_token``.
    tail : tuple
        The array's shape after its first axis (every value's too).
    dtype : type
        Its dtype.
    bounds : list of (int, int), optional
        Each value's rows, when they are not ``counts`` rows after rows in order.
    literal : bool
        Rows of a pool of literals (``record.literals``): constants, known values.
    sources : list of NDArray, optional
        The steps' outputs ``array`` was gathered from, while autograd records:
        a backward pass that freed any of them (or ``array``) freed the
        values' graph (``history_freed``), though the gather itself may be
        off its path.  Those without history (steps run outside autograd)
        are let go at once.
    """

    __slots__ = ("array", "bounds", "mode", "token", "tail", "dtype", "members", "host",
                 "literal", "freed", "sources")

    def __init__(self, array, counts, mode, token, tail, dtype, bounds=None, literal=False,
                 sources=None):
        self.array, self.mode, self.token = array, mode, token
        if sources is not None:     # what has history now (and so can lose it)
            sources = [a for a in {id(a): a for a in [array] + sources}.values()
                       if has_history(a)]
        self.sources = sources
        self.tail, self.dtype = tail, dtype
        self.literal = literal  # rows of a literal pool: constants whose values are known
        if bounds is None:
            ends = np.cumsum(counts).tolist()
            bounds = list(zip([0] + ends[:-1], ends))
        self.bounds = bounds
        self.members = None     # weak references to the values not cut out yet
        self.host = None        # the array's values in numpy, once read
        self.freed = None       # (passes counted when asked, answer): ``history_freed``

    def history_freed(self):
        """Whether a backward pass freed the array's graph (a pass since it was
        computed went through it); asked once per graph-freeing pass."""
        if self.literal or not self.mode[0]:
            return False                # computed without a graph: nothing to free
        count = _passes()[0]
        found = self.freed
        if found is None or (found[0] != count and not found[1]):
            arrays = [self.array] if self.sources is None else self.sources
            found = self.freed = (count, not all(has_history(a) for a in arrays))
        return found[1]

    def _recorded_as(self):
        """Autograd's modes to cut values out in: the flush's, without recording
        once a pass freed the array (the pieces are constants, as eagerly)."""
        if self.mode[0] and self.history_freed():
            return (False, self.mode[1])
        return self.mode

    def hand_out(self, lazies):
        """Give value ``k`` of ``lazies`` rows ``k``, to be cut out of the array only
        when a value is used as an NDArray (``cut_out``): most values a flush
        hands out inside a scope are only read again by its next flushes, which
        gather rows from the array itself."""
        members = self.members = []
        epoch = epoch_stamp()               # computed now (``LazyArray.history_freed``)
        for k, lazy in enumerate(lazies):
            lazy._node, lazy._rows, lazy._epoch = None, (self, k), epoch
            members.append(weakref.ref(lazy))

    def cut_out(self):
        """Cut every value still alive out of the array, in one ``split`` recorded
        as the flush that computed the array was."""
        members, self.members = self.members, None
        if members is None:
            return
        if len(self.bounds) == 1:
            pieces = [self.slice(0)]
        else:
            counts = [end - begin for begin, end in self.bounds]
            with autograd._RecordingStateScope(*self._recorded_as()):  # pylint: disable=W0212
                pieces = split_rows(self._rows_in_order(), counts)
        for ref, piece in zip(members, pieces):
            lazy = ref()
            if lazy is not None and lazy._h is None and lazy._node is None:
                lazy._h, piece.handle = piece.handle, None

    def _rows_in_order(self):
        """The array, or the values' rows of it taken in order when they are
        not all of it in order (rows of a step's output, ``run.lowering``)."""
        bounds = self.bounds
        if bounds[0][0] == 0 and bounds[-1][1] == self.array.shape[0] and all(
                end == begin for (_, end), (begin, _) in zip(bounds, bounds[1:])):
            return self.array
        index = np.concatenate([np.arange(begin, end) for begin, end in bounds])
        return nd.take(self.array, device_array(index.astype(np.int32), self.array.context))

    def host_rows(self, k):
        """Value ``k``'s rows as a numpy array, from one host copy of the array."""
        host = self.host
        if host is None:
            host = self.host = self.array.asnumpy()
        begin, end = self.bounds[k]
        return host[begin:end].copy()

    def slice(self, k):
        """Value ``k``'s rows of the output, as a new array (recorded as the flush was)."""
        begin, end = self.bounds[k]
        with autograd._RecordingStateScope(*self._recorded_as()):  # pylint: disable=W0212
            return row_slice(self.array, begin, end)


def split_rows(array, counts):
    """``array`` cut along axis 0 into pieces of ``counts`` rows (one recorded op).

    Pieces of equal size (every tree's root state: one row) use ``split``,
    whose forward and backward take a third of ``split_v2``'s engine time here.
    """
    if len(counts) == 1:
        return [array]
    if array.dtype == np.bool_:         # (``split`` has no boolean kernel)
        bounds = np.cumsum([0] + list(counts)).tolist()
        return [row_slice(array, b, e) for b, e in zip(bounds[:-1], bounds[1:])]
    if counts.count(counts[0]) == len(counts):
        return nd.split(array, num_outputs=len(counts), axis=0)
    bounds = np.cumsum(counts)[:-1]
    return nd.split_v2(array, tuple(int(b) for b in bounds), axis=0)
