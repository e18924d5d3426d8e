"""Views: values that share their base's memory in eager MXNet.

``x.reshape(...)``, ``x.detach()`` and indexing that NDArray answers with a
view (``x[i]``, ``x[i:j]``) give arrays whose memory is ``x``'s: an in-place
update of ``x`` (``x += y``, outside ``autograd.record()``) shows in them.
Inside a scope a view is a value of its own node.  The base keeps (weakly)
the views taken of it, with how to take each again (:func:`note`); an update
in place takes every live view again on the new value and makes the view's
object stand for it (:func:`follow`), so its readers see eager's values.
"""
import bisect
import ctypes
import weakref

import numpy as np
from mxnet import autograd, nd
from mxnet.base import _LIB, check_call

from ..ir.graph import LEAF, Node
from ..ir.known import constant_array
from . import context
from .lazy import LazyArray

_SHARES = {}        # (shape, key) -> whether eager's x[key] shares x's memory
GETITEM = [None]    # x[key] inside a scope, keeping no view (``arithmetic``)


def note(base, view, how):
    """Keep ``view`` of LazyArray ``base``, taken as ``how`` says: ``("index",
    key)``, ``("reshape", kwargs)`` or ``("detach", None)``.  Returns ``view``."""
    node = base._node       # (a Node, a recording frame's FrameCore or None)
    if view is base or type(node) is Node and node.kind == LEAF:
        return view         # (an input: its update in place is refused)
    views = getattr(base, "_views", None)
    if views is None:
        views = base._views = []
    views.append((weakref.ref(view), how))
    if getattr(view, "_views", None) is None:
        view._views = []        # a view: never reused for another value (``FrameCore.scan``)
    return view


def follow(rec, base, done=None):
    """After ``base`` took a new value in place, every live view of it takes
    its new value too (views of views in turn): a pending view becomes the
    view taken again of the new value (``rec.rebind``), a computed one eager's
    view of the computed base.  ``done``: the ids of the arrays followed
    already (a reshape to the base's own shape may be the base's value, so
    that each is noted a view of the other)."""
    views = getattr(base, "_views", None)
    if not views:
        return
    done = {id(base)} if done is None else done
    base._views = None
    for ref, how in views:
        view = ref()
        if view is None or id(view) in done:
            continue
        if how[0] == "index" and not shares_memory(base.shape, how[1]):
            continue
        done.add(id(view))
        if base._node is None:          # computed: share its memory from now on
            if view._node is None:
                _take_memory(view, _eager_view(base, how))
                follow(rec, view, done)
            continue
        if view._node is None:
            continue
        note(base, rec.rebind(view, _pending_view(rec, base, how)), how)
        follow(rec, view, done)


def shares_with_pending(rec, array, with_frame=True):
    """Whether computed ``array`` shares memory with an array a pending call
    (of the current frame too: ``with_frame``) reads (one of its views, its
    base, a view of the same base): eager code read those values before
    ``array`` is written.

    Identity is asked first (``Recorder.before_write``); this compares where
    the arrays' memory lies, once per array of the graph (``graph.spans``: the
    graph holds them).  The frame's values are asked each time: holding them
    would keep them alive, and which of them are alive shapes the templates.
    """
    span = _span(array)
    if span is None:
        return False
    graph, frame = rec.graph, rec.frame if with_frame else None
    held = [entry[2] for entry in graph.leaf_by_id.values()]
    held.extend(graph.param_arrays.values())
    spans = graph.spans
    for other in held:
        found = spans.get(id(other))
        if found is None or found[0] is not other:
            found = spans[id(other)] = (other, _span(other))
        if other is not array and _overlap(found[1], span, other, array):
            return True
    if frame is not None:
        for other in frame.vals.values():
            if other is not array and _overlap(_span(other), span, other, array):
                return True
    return False


def memory_index(arrays):
    """The memory of the computed arrays of ``arrays``, for ``in_index``: their
    first bytes in order, and the furthest end byte up to each."""
    spans = sorted(span for span in map(_span, arrays) if span is not None)
    ends, furthest = [], 0
    for _, end in spans:
        furthest = max(furthest, end)
        ends.append(furthest)
    return [start for start, _ in spans], ends


def in_index(array, index):
    """Whether computed ``array`` shares memory with an array of ``index``
    (``memory_index``): a bisection, whatever the number of arrays.  Contexts
    are not compared: a match of addresses on two devices only makes the
    waiting samples finish early."""
    span = _span(array)
    if span is None:
        return False
    starts, ends = index
    before = bisect.bisect_left(starts, span[1])     # those starting before its end
    return before > 0 and ends[before - 1] > span[0]


def _overlap(span, other_span, array, other):
    """Whether memory ``span`` of ``array`` and ``other_span`` of ``other`` overlap."""
    return span is not None and span[0] < other_span[1] and other_span[0] < span[1] \
        and array.context == other.context


def _span(array):
    """``(first byte, end byte)`` of a computed dense NDArray's memory, or None
    (not an NDArray, sparse, pending, or without memory yet).

    The array's pending writes finish first: MXNet allocates an operator's
    output when the operator runs, on the engine's thread, and
    ``MXNDArrayGetData`` allocates an array not allocated yet, on this one;
    both at once leave the operator writing memory the array no longer holds.
    """
    if type(array) is LazyArray:
        handle = array._h
    elif type(array) is nd.NDArray:
        handle = array.handle
    else:
        return None
    if handle is None:
        return None
    check_call(_LIB.MXNDArrayWaitToRead(handle))
    address = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(handle, ctypes.byref(address)))
    if not address.value:
        return None
    return (address.value, address.value + array.size * np.dtype(array.dtype).itemsize)


def _pending_view(rec, base, how):
    kind, arg = how
    if kind == "reshape":
        return rec.F.reshape(base, **arg)
    if kind == "detach":
        return rec.F.BlockGrad(base)
    return GETITEM[0](base, arg)


def _eager_view(base, how):
    kind, arg = how
    if kind == "reshape":
        return nd.NDArray.reshape(base, **arg)
    if kind == "detach":
        return nd.NDArray.detach(base)
    return nd.NDArray.__getitem__(base, arg)


def _take_memory(view, array):
    """Computed LazyArray ``view`` holds ``array``'s handle from now on."""
    old = view._h
    view._set_result(array)
    if old is not None:
        nd.NDArray(old)     # freed with this wrapper


def shares_memory(shape, key):
    """Whether eager ``x[key]`` shares the memory of an ``x`` of ``shape``: asked
    of a small array of zeros once per shape and key."""
    hashable = _hashable(key)
    if hashable is None:
        return False        # lists or arrays among the indices: a copy
    found = _SHARES.get((shape, hashable))
    if found is None:
        # (mx.nd's own arrays, not recorded; in autograd's modes as they are:
        # changing them would count as a change of the samples' modes)
        probe = nd.zeros(shape)
        view = probe[key]
        probe += 1
        found = _SHARES[(shape, hashable)] = bool(view.asnumpy().any())
    return found


def _hashable(key):
    """``key`` with its slices as tuples, or None if it holds anything but
    integers, slices, None and Ellipsis."""
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for part in parts:
        if isinstance(part, slice):
            out.append(("slice", part.start, part.stop, part.step))
        elif part is None or part is Ellipsis:
            out.append(part)
        elif isinstance(part, (int, np.integer)):
            out.append(int(part))
        else:
            return None
    return (isinstance(key, tuple),) + tuple(out)


# -- rows of an array from outside the scope ---------------------------------------------
# ``self.table[word]`` (an NDArray held by the model, a global) is NDArray's own
# view, a new array each time: as a leaf of its own every row would be analysed
# apart and gathered from as many arrays.  The views NDArray makes of such an
# array inside a scope are noted with their rows; a frame that reads one reads
# those rows of the array's leaf (``Recorder.new_leaf``), as it reads rows of
# an array it was given.

_AT = nd.NDArray._at                # pylint: disable=protected-access
_SLICE = nd.NDArray._slice          # pylint: disable=protected-access
_RESHAPE = nd.NDArray.reshape


#: Views noted at most per scope; past it the notes start again (views not
#: noted are leaves of their own: slower, as exact).
MAX_NOTED_ROWS = 20000


def _noted_at(self, idx):
    """``NDArray._at`` (``x[i]``), noted inside a sample (``outside_rows``)."""
    view = _AT(self, idx)
    if type(self) is nd.NDArray and context.TLS.recorder is not None:
        begin = idx + self.shape[0] if idx < 0 else idx
        _note_rows(view, self, begin, begin + 1)
    return view


def _noted_slice(self, start, stop):
    """``NDArray._slice`` (``x[i:j]``), noted inside a sample (``outside_rows``)."""
    view = _SLICE(self, start, stop)
    if type(self) is nd.NDArray and context.TLS.recorder is not None:
        begin, end, _ = slice(start, stop).indices(self.shape[0])
        if end - begin == view.shape[0]:
            _note_rows(view, self, begin, end)
    return view


def _noted_reshape(self, *shape, **kwargs):
    """``NDArray.reshape`` of a noted view (``table[word].reshape((1, -1))``):
    the same rows, noted (``outside_rows``)."""
    view = _RESHAPE(self, *shape, **kwargs)
    rec = context.TLS.recorder
    if rec is not None and type(self) is nd.NDArray and type(view) is nd.NDArray:
        found = outside_rows(rec, self)
        if found is not None:
            _note_rows(view, *found)
    return view


def _note_rows(view, base, begin, end):
    """Note ``view``, rows ``begin:end`` of ``base``, for the recorder.

    Only inside a sample's call (where ``Recorder.new_leaf`` reads them) and
    where the rows are what autograd makes of them eagerly: a view made while
    recording is recorded by MXNet (a gradient reaches ``base``), one made
    outside ``autograd.record()`` is a constant unless ``base`` is one.
    """
    rec = context.TLS.recorder
    if rec.depth <= 0 or not 0 <= begin < end <= base.shape[0]:
        return
    noted = rec.outside_rows
    if autograd.is_recording() or constant_array(base):
        if len(noted) >= MAX_NOTED_ROWS:
            noted.clear()
        noted[id(view)] = (view, base, begin, end)


def outside_rows(rec, array):
    """``(base, begin, end)`` if plain NDArray ``array`` is a view of rows of
    another one made in one of ``rec``'s samples (``_noted_at``,
    ``_noted_slice``), else None."""
    found = rec.outside_rows.get(id(array))
    if found is None or found[0] is not array:
        return None
    return found[1:]


def install():
    """Note the row views NDArray makes of plain arrays inside a scope."""
    nd.NDArray._at = _noted_at          # pylint: disable=protected-access
    nd.NDArray._slice = _noted_slice    # pylint: disable=protected-access
    nd.NDArray.reshape = _noted_reshape
