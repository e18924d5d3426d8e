"""Vectorizing a template: repeated independent calls become one call on stacked rows.

A frame that loops over a sample-dependent count (a node's children) records
one copy of the loop's body per iteration, so frames with 1, 2 or 5 children
have different templates.  This pass rewrites a segment so that its program
does not depend on the count:

* chains of additions of one-row values (``c = c + f_k * c_k``, ``sum(...)``,
  ``F.add_n``) become n-ary sums;
* calls with the same batching signature at the same dependency level (one
  call of each iteration of a loop body) become one *group*: one call on
  their inputs stacked along axis 0.  Inputs read from outside the frame are
  stacked by a view in the graph; inputs computed by an earlier group are
  that group's output; a one-row value every member reads is repeated;
* a sum over every member of a group becomes a ragged sum over the group's
  rows (``sum(axis=0)`` per call, a segment sum); summed values read from
  outside are stacked by a view and summed the same way.  Every internal term
  is summed that way, also alone, so the program of one iteration is the
  program of several; a one-row segment sum costs nothing at run time (it is
  skipped when every count of a batch is 1).

The program of a frame with k children then is the one with 1 child, with k
rows where the other has 1: frames of every count share one program, and the
counts enter the batch as row counts.  A group whose members' values are used
one by one (other than by a later group, a sum over all of them, or a
concatenation of all of them in order along axis 0, which is the group's
output as it is) is not formed, and the calls stay as they were.
"""
from collections import Counter, defaultdict

import numpy as np

from ..ir.calls import ADDS, NARY, scalar_argument
from ..ir.graph import slot
from ..ir.ops import Stand, opdef
from .sketch import Sketch, spec_key
from ..ir.rules import BROW, SHARED


class _Op:
    """A call of the segment (a step); ``level``: its depth inside the frame."""

    __slots__ = ("step", "index", "level", "group")

    def __init__(self, step, index):
        self.step, self.index, self.level, self.group = step, index, 0, None


class _Sum:
    """Additions of one-row values merged into one sum of ``terms``."""

    __slots__ = ("terms", "out", "shape", "dtype", "path", "index", "level", "signal",
                 "steps")

    def __init__(self, terms, step, index, signal):
        self.terms, self.out = terms, step.outs[0]
        self.shape, self.dtype = step.info.out_shapes[0], step.info.out_dtypes[0]
        self.path, self.index, self.level, self.signal = step.path, index, 0, signal


class _Group:
    """Calls at one level with one signature, run as one call on stacked rows."""

    __slots__ = ("members", "inputs", "level")

    def __init__(self, members, inputs):
        self.members, self.inputs, self.level = members, inputs, members[0].level


def vectorize(steps, exported, frame, accumulating=frozenset()):
    """The :class:`Sketch` of a segment's ``steps`` exporting positions ``exported``.

    ``accumulating`` holds the ids of the steps that ``sites.structure``
    found to carry a sum over a loop's iterations.
    """
    produced = {}
    for j, step in enumerate(steps):
        for idx, pos in enumerate(step.outs):
            produced[pos] = (j, idx)
    units = [_Op(step, j) for j, step in enumerate(steps)]
    _levels(units, produced)
    # Which additions accumulate across iterations shows once the iterations'
    # calls are grouped: group first with every call as it is.
    tentative = _form_groups(units, produced, set(), frame)
    member_of = {pos: group for group in tentative if len(group.members) > 1
                 for member in group.members for pos in member.step.outs}
    chosen = [total for total in _sums(steps, produced, set(exported))
              if _accumulates(total, member_of, produced)
              or any(id(steps[j]) in accumulating for j in total.steps)]
    if chosen:
        units = _units(steps, chosen)
        _levels(units, produced)
    forbidden = set()
    while True:
        groups = _form_groups(units, produced, forbidden, frame)
        bad = _misused(units, groups, produced, exported)
        if not bad:
            break
        forbidden |= bad
    return _emit(units, groups, produced, exported, frame)


# -- sums ---------------------------------------------------------------------------------

def _is_sum(step):
    """Whether a step adds one-row values of its output's shape (no broadcast)."""
    info = step.info
    if len(info.out_shapes) != 1 or info.out_shapes[0][:1] != (1,):
        return False
    if np.dtype(info.out_dtypes[0]).kind != "f":
        return False
    name = step.op.name
    if name == "_plus_scalar":
        return scalar_argument(step) == 0 and type(step.refs[0]) is int
    # ``info.link``: every input has the output's shape (``(1, H) + (H,)`` broadcasts).
    return (name in ADDS or name in NARY) and info.link


def _sums(steps, produced, exported):
    """Chains of additions (their intermediate sums read once, not exported) as
    ``_Sum`` objects, each with ``steps``: the indices of its additions."""
    uses = Counter(ref for step in steps for ref in step.refs if type(ref) is int)
    found, open_sums = [], {}
    for j, step in enumerate(steps):
        if not _is_sum(step) or any(
                _shape_of(ref, steps, produced) not in (None, step.info.out_shapes[0])
                for ref in step.refs if type(ref) is int):
            continue
        terms, members, inners = [], [j], []
        signal = step.op.name in NARY or step.op.name == "_plus_scalar"
        for ref in step.refs:
            inner = open_sums.get(ref) if type(ref) is int else None
            if inner is not None and uses[ref] == 1 and ref not in exported:
                terms.extend(inner.terms)
                members.extend(inner.steps)
                signal = signal or inner.signal
                inners.append(inner)
            elif type(ref) is not int and ref[0] == "c" and not ref[1].asnumpy().any():
                signal = True                   # a sum that starts from zeros
            else:
                terms.append(ref)
        if not terms:
            continue                # zeros plus zeros: nothing to sum, the addition stays
        positions = [ref for ref in terms if type(ref) is int]
        if len(set(positions)) != len(positions):
            continue                # a value added twice (h + h): the additions stay
        for inner in inners:
            found.remove(inner)
        total = _Sum(terms, step, j, signal)
        total.steps = members
        open_sums[step.outs[0]] = total
        found.append(total)
    return found


def _accumulates(total, member_of, produced):
    """Whether a chain of additions sums over the iterations of a loop.

    It does when it starts from zeros or is ``sum``/``add_n``, adds two or
    more values read from outside (the children's states), or adds two or
    more members of one group of calls (one per iteration).  Other chains
    (``a + b`` inside one iteration) stay additions, so they can group.
    """
    if total.signal:
        return True
    outside = sum(1 for ref in total.terms if type(ref) is not int or ref not in produced)
    if outside >= 2:
        return True
    seen = set()
    for ref in total.terms:
        group = member_of.get(ref) if type(ref) is int else None
        if group is not None:
            if id(group) in seen:
                return True
            seen.add(id(group))
    return False


def _units(steps, chosen):
    """The segment's units: a ``_Sum`` in place of each chosen chain's last addition."""
    by_root = {total.index: total for total in chosen}
    merged = {j for total in chosen for j in total.steps}
    units = []
    for j, step in enumerate(steps):
        if j in by_root:
            units.append(by_root[j])
        elif j not in merged:
            units.append(_Op(step, j))
    return units


def _shape_of(ref, steps, produced):
    where = produced.get(ref)
    if where is None:
        return None                            # read from outside: known to the frame
    j, idx = where
    return steps[j].info.out_shapes[idx]


def _levels(units, produced):
    """Each unit's level: 1 + the largest level of the units it reads."""
    level_of = {}
    for unit in units:
        refs = unit.terms if isinstance(unit, _Sum) else unit.step.refs
        level = 0
        for ref in refs:
            if type(ref) is int and ref in level_of:
                level = max(level, level_of[ref])
        unit.level = level + 1
        outs = (unit.out,) if isinstance(unit, _Sum) else unit.step.outs
        for pos in outs:
            level_of[pos] = unit.level


# -- groups -------------------------------------------------------------------------------

def _signature(op_unit):
    """What calls must share to be one group (level aside)."""
    step = op_unit.step
    info = step.info
    if info.kind != "op" or info.sig is None or info.rule.batching != "rows":
        return None
    if info.rule.program_form == "reshape":
        # A reshape's target names each call's rows: on stacked rows its analysis
        # (the group's output shape) would be wrong.
        return None
    shared = tuple(step.refs[k] if type(step.refs[k]) is int else id(step.refs[k][1])
                   for k in info.shared_pos)
    return (step.op.name, info.attrs, info.sig, shared, len(info.out_shapes))


def _form_groups(units, produced, forbidden, frame):
    """Groups of two or more calls (a list, by level); sets ``unit.group``."""
    owner = {}                                 # position -> (_Op unit, output idx)
    candidates = defaultdict(list)
    for unit in units:
        if isinstance(unit, _Op):
            unit.group = None
            for idx, pos in enumerate(unit.step.outs):
                owner[pos] = (unit, idx)
            sig = _signature(unit)
            if sig is not None:
                candidates[(unit.level, sig)].append(unit)
    groups = []
    for (_, _), found in sorted(candidates.items(), key=lambda item: (
            item[0][0], item[1][0].index)):
        for members in _by_sources(found, owner, produced):
            if len(members) < 2 or frozenset(m.index for m in members) in forbidden:
                continue
            inputs = _group_inputs(members, owner, produced, frame)
            if inputs is None:
                continue
            group = _Group(members, inputs)
            for member in members:
                member.group = group
            groups.append(group)
    return groups


def _by_sources(members, owner, produced):
    """``members`` split by where their inputs come from, order kept.

    Calls of one signature at one level may be unrelated (a loop body's
    addition and an addition elsewhere): only those reading their inputs
    alike (each from the same group, or from outside, or the same value)
    can be one group.
    """
    parts = {}
    for member in members:
        pattern = []
        for ref in member.step.refs:
            if type(ref) is not int or ref not in produced:
                pattern.append("outside")
            elif ref not in owner:
                pattern.append(("value", ref))
            else:
                unit, idx = owner[ref]
                pattern.append(("group", id(unit.group), idx) if unit.group is not None
                               else ("value", ref))
        parts.setdefault(tuple(pattern), []).append(member)
    return list(parts.values())


def _group_inputs(members, owner, produced, frame):
    """Per input of the calls, how the group reads it; None if it cannot."""
    info = members[0].step.info
    # A one-row input every member reads is passed once where the operator
    # broadcasts it (``broadcast_mul``); ``elemwise_mul`` needs it stacked.
    broadcasts = info.rule.broadcasts
    inputs = []
    for k, role in enumerate(info.meta):
        refs = [m.step.refs[k] for m in members]
        if role == SHARED:
            inputs.append(("same", refs[0]))
            continue
        internal = [type(r) is int and r in produced for r in refs]
        if all(internal):
            if not all(r in owner for r in refs):
                return None                     # a sum's result: not stacked

            first, idx = owner[refs[0]]
            group = first.group
            if group is not None and len(group.members) == len(members) and all(
                    owner[r] == (m, idx) for r, m in zip(refs, group.members)) and (
                        role != BROW or _rows_kept(members, [
                            owner[r][0].step.info.out_shapes[idx][0] for r in refs])):
                inputs.append(("group", group, idx))
                continue
            if role == BROW and len(set(refs)) == 1 and first.group is None \
                    and first.step.info.out_shapes[idx][0] == 1 and broadcasts:
                inputs.append(("repeat", refs[0]))
                continue
            return None
        if any(internal):
            return None
        if role == BROW and len(set(spec_key(_outside(r)) for r in refs)) == 1 \
                and _outside_rows(refs[0], frame) == 1 and broadcasts:
            inputs.append(("repeat", refs[0]))      # one outside row for every member
            continue
        if role == BROW and not _rows_kept(members, [_outside_rows(r, frame) for r in refs]):
            return None       # a row broadcast to several: stacked, it would not line up
        if any(type(r) is not int and r[0] == "p" for r in refs):
            return None       # weights are the program's parameters, not rows to stack
        inputs.append(("stack", refs))
    if not any(how[0] in ("stack", "group") for how in inputs):
        return None       # every member reads the same rows: nothing to stack
    return inputs


def _rows_kept(members, rows):
    """Whether each member's input has the member's own rows (``rows``, per member)."""
    return all(r == m.step.info.out_shapes[0][0] for r, m in zip(rows, members))


def _misused(units, groups, produced, exported):
    """Groups some of whose members' values are read one by one (not allowed)."""
    member_of = {}
    for group in groups:
        for i, member in enumerate(group.members):
            for idx, pos in enumerate(member.step.outs):
                member_of[pos] = (group, i, idx)
    bad = set()
    for unit in units:
        if isinstance(unit, _Sum):
            covered = defaultdict(set)
            for ref in unit.terms:
                found = member_of.get(ref) if type(ref) is int else None
                if found is not None:
                    group, i, idx = found
                    if i in covered[(group, idx)]:
                        bad.add(_key(group))       # a member summed twice
                    covered[(group, idx)].add(i)
            for (group, _), seen in covered.items():
                if len(seen) != len(group.members):
                    bad.add(_key(group))
            continue
        if _stacks_group(unit.step, member_of):
            continue
        for k, ref in enumerate(unit.step.refs):
            found = member_of.get(ref) if type(ref) is int else None
            if found is None:
                continue
            group = found[0]
            if unit.group is None or unit.group.inputs[k][0] != "group" \
                    or unit.group.inputs[k][1] is not group:
                bad.add(_key(group))
    return bad


def _key(group):
    return frozenset(m.index for m in group.members)


def _stacks_group(step, member_of):
    """Whether ``step`` concatenates along axis 0 the values of every member of
    one group, in order (``F.concat(*[f(h) for h in kids], dim=0)``): that is
    the group's output as it is."""
    if step.op.name not in ("concat", "Concat") or step.kwargs.get("dim") != 0:
        return False
    found = [member_of.get(ref) if type(ref) is int else None for ref in step.refs]
    return all(f is not None and f[0] is found[0][0] and f[1:] == (i, found[0][2])
               for i, f in enumerate(found)) and len(found) == len(found[0][0].members)


# -- emitting the program -----------------------------------------------------------------

def _outside_rows(ref, frame):
    """Rows of a value read from outside (a position of ``frame``, a parameter, a
    constant); None when unknown."""
    if type(ref) is int:
        return frame.out_shapes[ref][0]
    array = ref[1].data() if ref[0] == "p" else ref[1]
    shape = getattr(array, "shape", None)
    return shape[0] if shape else None


def _outside(ref):
    """The input spec of a value read from outside (a position or a constant)."""
    return ("pos", ref) if type(ref) is int else ref


class _Emitter:
    """Builds the :class:`Sketch` unit by unit (``where``: position -> program value)."""

    def __init__(self, frame, produced):
        self.frame, self.produced = frame, produced
        self.rec = frame.rec
        self.plan = Sketch()
        self.where = {}           # position -> (("n", j, idx), rows or None)
        self.shape = {}           # program value -> (shape, dtype)
        self._uid = 0

    def value(self, ref):
        """The program ref of a step's input ``ref`` (a whole value)."""
        if type(ref) is int and ref in self.produced:
            found, rows = self.where[ref]
            if rows is not None:
                raise AssertionError("a group member read alone")  # _misused rules it out
            return found
        if type(ref) is int or ref[0] == "c":
            return self.plan.input_ref(_outside(ref))
        return self.plan.param_ref(ref)

    def shape_of(self, ref):
        """Shape and dtype of a step input ``ref``."""
        if type(ref) is int:
            if ref in self.produced:
                return self.shape[self.where[ref][0]]
            return self.frame.out_shapes[ref], self.frame.out_dtypes[ref]
        array = ref[1].data() if ref[0] == "p" else ref[1]
        return tuple(array.shape), np.dtype(array.dtype).type

    def stand(self, shape, dtype):
        self._uid += 1
        return (Stand(tuple(shape), dtype, self._uid), 0)

    def entry(self, op, args, kwargs, refs, sources, path):
        """Analyse and add one entry; its output refs."""
        info = self.rec.analyse_stub(op, args, kwargs, sources)
        j = self.plan.add((op, args, kwargs, tuple(refs), info, path))
        outs = []
        for idx, (shape, dtype) in enumerate(zip(info.out_shapes, info.out_dtypes)):
            ref = ("n", j, idx)
            self.shape[ref] = (shape, dtype)
            outs.append(ref)
        return outs

    def source(self, ref, shape, dtype):
        """A stand-in for analysis: parameters as their graph leaves."""
        if type(ref) is tuple and ref[0] == "p":
            lazy = self.rec.param(ref[1])
            return (lazy._node, lazy._idx)
        return self.stand(shape, dtype)

    # -- units ------------------------------------------------------------------------
    def op(self, unit):
        step = unit.step
        whole = self._whole(step)
        if whole is not None:                   # a group's values stacked: its output
            self.where[step.outs[0]] = (whole, None)
            return
        refs, sources = [], []
        for ref in step.refs:
            refs.append(self.value(ref))
            sources.append(self.source(ref, *self.shape_of(ref)))
        outs = self._copy(step, refs, sources)
        for idx, pos in enumerate(step.outs):
            self.where[pos] = (outs[idx], None)

    def _whole(self, step):
        """The group output that ``step`` concatenates in order, or None (``_stacks_group``)."""
        if step.op.name not in ("concat", "Concat") or step.kwargs.get("dim") != 0:
            return None
        found, end = None, 0
        for ref in step.refs:
            value, rows = self.where.get(ref, (None, None)) if type(ref) is int else (None, None)
            if value is not None and rows is None and len(step.refs) == 1:
                return value                    # one value "concatenated": itself
            if rows is None or rows[0] != end or found not in (None, value):
                return None
            found, end = value, rows[1]
        return found if end == self.shape[found][0][0] else None

    def _copy(self, step, refs, sources):
        j = self.plan.add((step.op, step.args, step.kwargs, tuple(refs), step.info, step.path))
        outs = []
        for idx, (shape, dtype) in enumerate(zip(step.info.out_shapes, step.info.out_dtypes)):
            ref = ("n", j, idx)
            self.shape[ref] = (shape, dtype)
            outs.append(ref)
        return outs

    def group(self, group):
        lead = group.members[0].step
        refs, sources = [], []
        for k, how in enumerate(group.inputs):
            kind = how[0]
            if kind in ("same", "repeat"):
                ref = how[1]
                refs.append(self.value(ref))
                sources.append(self.source(ref, *self.shape_of(ref)))
            elif kind == "group":
                found = self.where[how[1].members[0].step.outs[how[2]]][0]
                refs.append(found)
                sources.append(self.stand(*self.shape[found]))
            else:                                   # stack values read from outside
                specs = tuple(_outside(r) for r in how[1])
                refs.append(self.plan.input_ref(("view", specs)))
                shapes = [self.shape_of(r) for r in how[1]]
                rows = sum(s[0][0] for s in shapes)
                sources.append(self.stand((rows,) + tuple(shapes[0][0][1:]), shapes[0][1]))
        outs = self.entry(lead.op, lead.args, lead.kwargs, refs, sources, lead.path)
        for idx in range(len(outs)):
            start = 0
            for member in group.members:
                rows = member.step.info.out_shapes[idx][0]
                self.where[member.step.outs[idx]] = (outs[idx], (start, start + rows))
                start += rows
        for idx, ref in enumerate(outs):        # the group's whole output, for readers
            self.where[("group", id(group), idx)] = (ref, None)

    def total(self, unit):
        """A sum: a segment sum per group and for stacked outside terms, then adds.

        A parameter among the terms (``x + q`` of a one-row ``x`` and a
        parameter of its shape) is added as it is: one value for every call,
        it is no row of a call to stack.
        """
        partials, outside, seen = [], [], set()
        for ref in unit.terms:
            if type(ref) is int and ref in self.produced:
                found, rows = self.where[ref]
                if found in seen:
                    continue
                seen.add(found)
                partials.append(self._segment_sum(found))
            elif type(ref) is not int and ref[0] != "c":
                found = self.value(ref)
                self.shape[found] = self.shape_of(ref)
                partials.append(found)
            else:
                outside.append(ref)
        if len(outside) >= 2 or (outside and unit.signal):
            specs = tuple(_outside(r) for r in outside)
            view = self.plan.input_ref(("view", specs))
            rows = sum(self.shape_of(r)[0][0] for r in outside)
            self.shape[view] = ((rows,) + tuple(unit.shape[1:]), unit.dtype)
            partials.append(self._segment_sum(view))
        elif outside:
            ref = self.value(outside[0])
            self.shape[ref] = self.shape_of(outside[0])
            partials.append(ref)
        result = partials[0]
        for other in partials[1:]:
            sources = [self.stand(*self.shape[result]), self.stand(*self.shape[other])]
            result = self.entry(opdef("broadcast_add"), (slot(0), slot(1)), {},
                                [result, other], sources, unit.path)[0]
        if result[0] != "n":                      # a value read from outside, alone
            result = self._segment_sum(result)
        self.where[unit.out] = (result, None)

    def _segment_sum(self, ref):
        shape, dtype = self.shape[ref]
        return self.entry(opdef("sum"), (slot(0),), {"axis": 0, "keepdims": True}, [ref],
                          [self.stand(shape, dtype)], ())[0]


def _emit(units, groups, produced, exported, frame):
    emitter = _Emitter(frame, produced)
    done = set()
    for unit in sorted(units, key=lambda u: (u.level, u.index)):
        if isinstance(unit, _Sum):
            emitter.total(unit)
        elif unit.group is None:
            emitter.op(unit)
        elif id(unit.group) not in done:
            done.add(id(unit.group))
            emitter.group(unit.group)
    plan = emitter.plan
    for pos in exported:
        (_, j, idx), rows = emitter.where[pos]
        plan.exports.append((j, idx, rows))
    return plan
