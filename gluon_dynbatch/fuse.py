"""Fusion: runs of row-wise operators of a replay template become one node.

Every recorded node costs Python time to record, plan, walk and free.  Inside
a child block's template, consecutive operators that batch row by row (a
``RowRule`` whose inputs are concatenated without repeating rows, or shared)
can run as one node: batching the fused node over many calls runs each member
operator batched over the same calls, exactly what per-operator batching does.

A member qualifies when its rule is ``RowRule``, it has a signature, its
gradient is not identically zero (see ``signatures.NO_GRADIENT``), and every
input is ``ROW``, ``SHARED``, or the single non-shared input of the operator
(``BROW`` there never repeats rows).  Binary broadcasting operators do not
qualify: whether they repeat rows depends on row counts, which differ between
calls of different arity, and fusion must not depend on them (variable arity
must not split batches).  A run is contiguous in the template's (topological)
order, so it is convex; its values used elsewhere become the fused node's
outputs.
"""
from .signatures import BROW, NO_GRADIENT, ROW, SHARED, RowRule, call_as_recorded

MIN_RUN = 2     # shorter runs stay as they are


class FusedOp:
    """The operator of a fused node: member operators evaluated in order.

    ``members`` hold ``(op, args, kwargs, sources)`` where a source is
    ``("x", j)`` the fused node's input ``j`` or ``("m", i, idx)`` output
    ``idx`` of member ``i``; ``exports`` list the ``(i, idx)`` that are the
    fused node's outputs.
    """

    __slots__ = ("members", "exports", "name", "path")

    def __init__(self, members, exports):
        self.members = members
        self.exports = exports
        self.name = "fused"
        self.path = None

    def __repr__(self):
        return "FusedOp(%s)" % ", ".join(m[0].name for m in self.members)

    def run(self, F, inputs):
        """Evaluate the members on ``inputs`` (single or batched, nd or sym)."""
        results = []
        for op, args, kwargs, sources in self.members:
            member_inputs = [inputs[s[1]] if s[0] == "x" else results[s[1]][s[2]]
                             for s in sources]
            results.append(call_as_recorded(F, _Member(op, args, kwargs), member_inputs))
        return [results[i][idx] for i, idx in self.exports]


class _Member:
    """What ``call_as_recorded`` reads of a node."""

    __slots__ = ("op", "args", "kwargs")

    def __init__(self, op, args, kwargs):
        self.op, self.args, self.kwargs = op, args, kwargs


class FusedRule(RowRule):
    """Batches a fused node: inputs concatenated (``ROW``) or passed once (``SHARED``)."""

    def __init__(self):
        super().__init__(None)

    def signature(self, node):      # fused nodes come with their CallInfo
        raise NotImplementedError("fused nodes are signed when fused")

    def batched_call(self, F, node, inputs):
        return node.op.run(F, inputs)


FUSED_RULE = FusedRule()


class FusedInfo:
    """The ``CallInfo`` of a fused node (see ``record.CallInfo``)."""

    __slots__ = ("out_shapes", "out_dtypes", "attrs", "rule", "meta", "kind", "sig",
                 "shared_pos", "cacheable", "stateful")

    def __init__(self, out_shapes, out_dtypes, attrs, roles, sig):
        self.out_shapes, self.out_dtypes = out_shapes, out_dtypes
        self.attrs, self.meta, self.sig = attrs, roles, sig
        self.rule = FUSED_RULE
        self.kind = "op"
        self.shared_pos = tuple(k for k, role in enumerate(roles) if role == SHARED)
        self.cacheable = True
        self.stateful = False


def fusable(op, info):
    """Whether a template entry may join a fused run (see the module docstring)."""
    if info.kind != "op" or info.sig is None or type(info.rule) is not RowRule:
        return False
    if op.name in NO_GRADIENT or info.stateful:
        return False
    roles = info.meta
    free = [r for r in roles if r != SHARED]
    return all(r in (ROW, SHARED) for r in roles) or (len(free) == 1 and free[0] == BROW)


def fuse_entries(entries, outputs):
    """Replace runs of fusable template entries by fused entries.

    Parameters
    ----------
    entries : list of tuple
        ``(op, args, kwargs, refs, info, path)`` of a template, refs as in
        ``replay.Template``.
    outputs : nested refs
        The template's outputs.

    Returns
    -------
    (entries, outputs)
        With fused entries and the refs renumbered.
    """
    used_later = _uses(entries, outputs)
    new_entries, where = [], {}       # where: (old j, idx) -> new ref
    run = []
    for j, entry in enumerate(entries):
        if fusable(entry[0], entry[4]):
            if run and not _joins(run, entry):
                _flush_run(run, entries, used_later, new_entries, where)
                run = []
            run.append(j)
            continue
        _flush_run(run, entries, used_later, new_entries, where)
        run = []
        _append(j, entries, new_entries, where)
    _flush_run(run, entries, used_later, new_entries, where)
    return new_entries, _renumber_out(outputs, where)


def _append(j, entries, new_entries, where):
    """Append entry ``j`` unchanged but for renumbered refs."""
    op, args, kwargs, refs, info, path = entries[j]
    where.update({(j, idx): ("n", len(new_entries), idx)
                  for idx in range(len(info.out_shapes))})
    new_entries.append((op, args, kwargs, _renumber(refs, where), info, path))


def _joins(run, entry):
    """Whether ``entry`` can extend ``run`` (its shared inputs must not be members)."""
    members = set(run)
    for ref, role in zip(entry[3], entry[4].meta):
        if role == SHARED and ref[0] == "n" and ref[1] in members:
            return False
    return True


def _uses(entries, outputs):
    """Per (entry, idx): the entries and outputs that read it."""
    used = {}
    for j, entry in enumerate(entries):
        for ref in entry[3]:
            if ref[0] == "n":
                used.setdefault((ref[1], ref[2]), set()).add(j)
    for ref in _out_refs(outputs):
        if ref[0] == "n":
            used.setdefault((ref[1], ref[2]), set()).add("out")
    return used


def _flush_run(run, entries, used_later, new_entries, where):
    """Append ``run`` to ``new_entries``: fused, or as it is when too short."""
    if not run:
        return
    fused = _fused_entry(run, entries, used_later) if len(run) >= MIN_RUN else None
    if fused is None:
        for j in run:
            _append(j, entries, new_entries, where)
        return
    entry, exports = fused
    for pos, (j, idx) in enumerate(exports):
        where[(j, idx)] = ("n", len(new_entries), pos)
    refs = _renumber(entry[3], where)
    new_entries.append(entry[:3] + (refs,) + entry[4:])


def _fused_entry(run, entries, used_later):
    """One fused entry for entries ``run``; None if it has no row input."""
    members, inputs, roles, input_pos = [], [], [], {}
    local = {j: i for i, j in enumerate(run)}
    for j in run:
        op, args, kwargs, refs, info, _path = entries[j]
        sources = []
        for ref, role in zip(refs, info.meta):
            if ref[0] == "n" and ref[1] in local:
                sources.append(("m", local[ref[1]], ref[2]))
                continue
            want = SHARED if role == SHARED else ROW
            pos = input_pos.get(ref)
            if pos is None:
                pos = input_pos[ref] = len(inputs)
                inputs.append(ref)
                roles.append(want)
            elif roles[pos] != want:
                return None              # one value used both ways: keep unfused
            sources.append(("x", pos))
        members.append((op, args, kwargs, tuple(sources)))
    if ROW not in roles:
        return None
    members_set = set(run)
    exports = [(j, idx) for j in run for idx in range(len(entries[j][4].out_shapes))
               if any(u == "out" or u not in members_set
                      for u in used_later.get((j, idx), ()))]
    if not exports:
        return None
    op = FusedOp(tuple(members), tuple((local[j], idx) for j, idx in exports))
    structure = tuple((entries[j][0].name, entries[j][4].attrs, entries[j][4].sig, m[3])
                      for j, m in zip(run, members))
    info = FusedInfo(tuple(entries[j][4].out_shapes[idx] for j, idx in exports),
                     tuple(entries[j][4].out_dtypes[idx] for j, idx in exports),
                     ("fused", structure, op.exports), tuple(roles),
                     ("fused", structure, op.exports, tuple(roles)))
    path = entries[run[0]][5]
    return (op, (), {}, tuple(inputs), info, path), exports


def _renumber(refs, where):
    return tuple(where[(ref[1], ref[2])] if ref[0] == "n" else ref for ref in refs)


def _out_refs(obj):
    kind = obj[0]
    if isinstance(kind, type):
        for item in obj[1]:
            yield from _out_refs(item)
    elif kind in ("a", "n", "p", "c"):
        yield obj


def _renumber_out(obj, where):
    kind = obj[0]
    if isinstance(kind, type):
        return (kind, [_renumber_out(item, where) for item in obj[1]])
    if kind == "n":
        return where[(obj[1], obj[2])]
    return obj
