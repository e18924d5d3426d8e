# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled scan of a graph before it runs (``graph.Graph.live_and_needed``).

A scope whose samples read values flushes once per round of reads; each
flush visits every pending node once, so the visit is compiled.
"""

cdef str LEAF = "leaf"


def live_and_needed(list nodes):
    """``(live, needed)`` of ``nodes`` in creation order (see ``Graph.live_and_needed``)."""
    cdef Py_ssize_t n = len(nodes), k, idx
    cdef bytearray marks = bytearray(n)
    cdef unsigned char[::1] mark = marks
    cdef list live = [], needed, outs
    cdef object node, ref, lazy, value
    for k in range(n - 1, -1, -1):
        node = nodes[k]
        outs = node.outs
        if outs is not None and node.kind != LEAF:
            for idx in range(len(outs) - 1, -1, -1):
                ref = outs[idx]
                if ref is None:
                    continue
                lazy = ref()
                if lazy is not None and lazy._h is None:     # held and pending
                    live.append((node, idx, lazy))
                    mark[k] = 1
        if mark[k]:
            for value in node.inputs:
                mark[<Py_ssize_t>value[0].id] = 1
    live.reverse()
    needed = [nodes[k] for k in range(n) if mark[k]]
    return live, needed
