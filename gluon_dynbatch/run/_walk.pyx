# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled loops of a walk over a plan (``lowering.Lowering``).

A flush of samples that read values runs small plans often: per step input
and per value handed out, a walk visits every sample's node.  These loops
are the part of a walk that is per node; what they find is used by the
Python code of ``lowering.py`` as before.
"""
import numpy as np

cdef str VIEW = "view"
cdef str SLICE = "slice_axis"
cdef str STEP = "step"


def slice_bounds(list values):
    """``(base, begins, ends)`` when every ``(node, idx)`` of ``values`` is output 0
    of a row slice view (``x[i:j]``) of one graph value ``base``, its bounds
    Python ints with ``0 <= begin < end``; else None (``Lowering._row_slices``)."""
    cdef Py_ssize_t n = len(values), k
    cdef object first = values[0][0], view, op, src, kwargs, begin, end, value
    cdef object base_node, base_idx
    cdef tuple base
    if first.kind != VIEW or first.op.name != SLICE:
        return None
    op = first.op
    base = tuple(first.inputs[0])
    base_node, base_idx = base
    begins = np.empty(n, dtype=np.int64)
    ends = np.empty(n, dtype=np.int64)
    cdef long long[::1] b = begins, e = ends
    for k in range(n):
        value = values[k]
        view = value[0]
        if value[1] != 0 or view.kind != VIEW or view.op is not op:
            return None
        src = view.inputs[0]
        if src[0] is not base_node or src[1] != base_idx:
            return None
        kwargs = view.kwargs
        begin = kwargs["begin"]
        end = kwargs["end"]
        if type(begin) is not int or type(end) is not int or not 0 <= begin < end:
            return None         # open or negative bounds: resolved one by one
        b[k] = begin
        e[k] = end
    return base, begins, ends


def output_groups(list live, object token, object segments):
    """The values handed out by a walk, grouped by dtype and trailing shape:
    ``{(dtype, tail): (members, segments)}`` in first-seen order
    (``Lowering._walk_outputs``).

    A value that is a row of a step output of one row per node reads its
    segment from ``node.at`` (``SegmentWalker.assign``); any other asks
    ``segments(node, idx)``.
    """
    cdef dict groups = {}
    cdef object item, node, idx, key, found, at, start
    cdef list members, segs
    for item in live:
        node = item[0]
        idx = item[1]
        key = (node.out_dtypes[idx], node.out_shapes[idx][1:])
        found = groups.get(key)
        if found is None:
            found = groups[key] = ([], [])
        members = found[0]
        segs = found[1]
        members.append(item)
        at = node.at
        if at is not None and at[0][0] is token:
            start = at[1]
            segs.append((at[0][idx + 1], start, start + 1))
        else:
            segs.extend(segments(node, idx))
    return groups


def whole_step_rows(list members, list segs, list source_desc):
    """Whether each of ``members`` is exactly one segment ``segs`` of a step's output
    (``Lowering._in_step_outputs``)."""
    cdef Py_ssize_t n = len(members), k
    cdef object seg, node
    if len(segs) != n:
        return False
    for k in range(n):
        seg = segs[k]
        node = members[k][0]
        if source_desc[seg[0]][0] != STEP or \
                seg[2] - seg[1] != node.out_shapes[members[k][1]][0]:
            return False
    return True


cdef str CONCAT = "concat"
cdef str CONCAT_OP = "Concat"


def step_rows(object nodes, Py_ssize_t k, object token):
    """``(sids, starts, stops)`` of input ``k`` of every node, as int64 arrays, when
    each is a row of a step output of one row per node (``node.at``, see
    ``SegmentWalker.assign``) or a row concatenation of such rows (a node's
    children's states); else None (``Lowering._gather_rows``)."""
    cdef list sids = [], starts = []
    cdef object node, value, src, at, part, name
    cdef Py_ssize_t idx
    for node in nodes:
        value = node.inputs[k]
        src = value[0]
        at = src.at
        if at is not None and at[0][0] is token:
            idx = value[1]
            sids.append(at[0][idx + 1])
            starts.append(at[1])
            continue
        if src.kind != VIEW:
            return None
        name = src.op.name
        if name != CONCAT and name != CONCAT_OP:
            return None
        for part in src.inputs:
            at = part[0].at
            if at is None or at[0][0] is not token:
                return None
            idx = part[1]
            sids.append(at[0][idx + 1])
            starts.append(at[1])
    begins = np.array(starts, dtype=np.int64)
    return np.array(sids, dtype=np.int64), begins, begins + 1
