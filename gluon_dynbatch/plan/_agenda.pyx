# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled agenda planner (``planners._agenda_plan``, strategy ``"agenda"``).

Every flush an analysis budget plans visits each operator node here, with its
inputs and the views between them, so the visit is compiled: node ids index
flat arrays instead of dictionaries of nodes.
"""
from time import perf_counter

cdef str OP = "op", VIEW = "view"       # ir.graph's node kinds


cdef set _waits_for(object node, list memo):
    """The op nodes ``node`` waits for: its op inputs, those of the views it
    reads (memoised by view id) and ``node.deps``."""
    cdef set deps = set(node.deps)
    cdef object src, value
    cdef list found
    for value in node.inputs:
        src = value[0]
        if src.kind == OP:
            deps.add(src)
        elif src.kind == VIEW:
            found = memo[src.id]
            if found is None:
                found = memo[src.id] = list(_waits_for(src, memo))
            deps.update(found)
    return deps


def agenda_batches(list ops, Py_ssize_t num_ids, object deadline, Py_ssize_t every,
                   object out_of_time):
    """``(sig, nodes)`` batches of ``ops`` (op nodes in creation order) in the
    agenda's order: repeatedly every ready node of the signature whose nodes lie
    shallowest on average.  ``num_ids`` bounds the node ids; past ``deadline``
    (looked at every ``every`` nodes or batches) raises ``out_of_time()``.
    """
    cdef Py_ssize_t n = len(ops), k, pos, ticks = 0, count
    cdef list position = [-1] * num_ids        # node id -> index in ops
    cdef list memo = [None] * num_ids          # view id -> op nodes it waits for
    cdef list consumers = [None] * n           # index in ops -> indices waiting for it
    cdef list waiting = [0] * n
    cdef set deps
    cdef list batch, after
    cdef dict depth_sum = {}, counts = {}, ready = {}, mean_depth
    cdef object node, src, value, sig, dep
    for k in range(n):
        position[(<object>ops[k]).id] = k
    for k in range(n):
        node = ops[k]
        ticks += 1
        if deadline is not None and ticks % every == 0 and perf_counter() > deadline:
            raise out_of_time()
        deps = _waits_for(node, memo)
        for dep in deps:
            pos = position[dep.id]
            if pos < 0:
                raise RuntimeError("internal error: %r waits for a node not planned" % node)
            after = consumers[pos]
            if after is None:
                consumers[pos] = [k]
            else:
                after.append(k)
        count = len(deps)
        waiting[k] = count
        sig = node.sig
        depth_sum[sig] = depth_sum.get(sig, 0) + node.depth
        counts[sig] = counts.get(sig, 0) + 1
        if count == 0:
            ready.setdefault(sig, []).append(node)
    mean_depth = {sig: depth_sum[sig] / counts[sig] for sig in counts}
    batches = []
    while ready:
        sig = min(ready, key=mean_depth.__getitem__)
        batch = ready.pop(sig)
        ticks += 1
        if deadline is not None and ticks % every == 0 and perf_counter() > deadline:
            raise out_of_time()
        batches.append((sig, tuple(batch)))
        for node in batch:
            after = consumers[<Py_ssize_t>position[node.id]]
            if after is None:
                continue
            for pos in after:
                waiting[pos] -= 1
                if waiting[pos] == 0:
                    value = ops[pos]
                    ready.setdefault(value.sig, []).append(value)
    return batches
