"""Slices at positions of a sample's own, recorded with the position as data.

A pointer network feeds back ``H[i:i + 1]``, the encoder state its gold
pointer ``i`` names; a span model reads ``scores[:, i:i + 1]``; a CRF scores a
gold path with ``trans[prev, tag]``, entries of a weight.  Recorded as
written, the position is an attribute of the call, so every new position is
a new path through the frame's templates: learned, analysed and compiled
once per position, and batched only with frames that slice the same one.

A slice whose position is *not* fixed by the path that reaches it (two
frames at one template state sliced the same value at different positions)
is recorded from then on with its position as a literal, data like a word
id: rows as ``F.take(x, F.array(range(begin, end)), axis=0)`` and one column
of a matrix as ``F.pick(x, F.array([begin] * rows), axis=1, keepdims=True)``.
Both copy the same values (and gradients) as the slice.  The place in the
user's code of such a slice is remembered, so the same code reached on
another path takes that form at once.  Slices at positions fixed by the path
(``x[t:t + 1]`` at token ``t`` of a loop) keep the slice: a loop over a
sample's rows is vectorised whole (``templates.vectorize``).
"""
import numpy as np

from ..ir.ops import opdef
from ..record import _core, literals, passes, sites

_TAKE, _PICK = opdef("take"), opdef("pick")
_VARIES = "varies"
# A template state's ``seen``: {(position, axis, width): (begin, (site, axis, width))}
_VARYING_SITES = set()                  # (site, axis, width) whose positions are data
MAX_SITES = 10000


def slice_by_position(rec, x, axis, begin, end):
    """A slice of ``x`` along ``axis`` as a gather by a literal position, where
    the position varies at the frame's template state; else None.

    ``x`` is a value of the recording frame, or an array it reads (a weight:
    a tag's row of a CRF's transition matrix, ``trans[prev, tag]``, whose
    slice would otherwise be a value of weights named by its position).
    """
    if axis > 1 or axis == 1 and len(x.shape) != 2:
        return None
    # The rows (columns) as positions: negative bounds count from the end and
    # ``end=None`` is the end, as in Python and MXNet.
    first, stop, _ = slice(begin, end).indices(x.shape[axis])
    if stop <= first or axis == 1 and stop - first != 1:
        return None
    frame = rec.frame
    state = frame.state
    seen = state.seen
    if seen is None:
        seen = state.seen = {}
    held = x._idx if x._node is frame else frame.ref(x, read=False)
    if held is None:                    # a value of an enclosing call
        return None
    key = (held, axis, stop - first)
    got = seen.get(key)
    if got is None:                     # the first slice here: the trie is learning anyway
        got = seen[key] = (begin, (sites.capture(frame.caller), axis, stop - first))
    if got[0] != begin and got[0] is not _VARIES:
        if len(_VARYING_SITES) < MAX_SITES:
            _VARYING_SITES.add(got[1])
        got = seen[key] = (_VARIES, got[1])
    if got[0] is not _VARIES and got[1] not in _VARYING_SITES:
        return None
    if axis == 0:
        rows = literals.record(rec, np.arange(first, stop, dtype=np.float32))
        return rec.call_op(_TAKE, (x, rows), {"axis": 0})
    column = literals.record(rec, np.full(x.shape[0], first, dtype=np.float32))
    return rec.call_op(_PICK, (x, column), {"axis": 1, "keepdims": True})


passes.register_slices(slice_by_position)
# Where this pass leaves a slice as it is, ``RecorderCore.row_slice`` knows it from
# ``state.seen`` and records it without coming here.
_core.bind_frame_slices(passes.SLICES, slice_by_position, _VARYING_SITES, opdef("slice_axis"))
