"""Programs: a recorded sequence of calls run as one node, batched row by row.

Recording, planning and walking cost Python time per node.  What a frame
(``frames.py``) records -- a DynBatchBlock call, or a child block's -- is
therefore one node whose operator is a :class:`Program` when every call in
it batches row by row: each has a ``RowRule`` (inputs ``ROW``, ``BROW`` or
``SHARED``), a ``SegmentRule`` (ragged sum or mean over axis 0) or a
``ReshapeRule``; no views and no stateful operators;
parameters only ever shared (a one-row parameter that a ``broadcast_*``
operator spreads over each call's rows, or one of each call's whole shape
that it combines with each call's value, is shared too).

Programs that differ only in row counts (a node with 1, 2 or 5 children), or
in the Python numbers of their scalar arithmetic (``h / len(children)``), are
one program (interned by ``build``), so they batch together.  A batch of
N calls runs the program once on the calls' inputs concatenated along axis
0, each entry through its operator's batching rule.  What depends on the
calls' row counts enters as index arrays computed with numpy
(``ProgramRule.batch_arrays``): the repeats of one-row ``BROW`` inputs and the
padded indices of ragged sums, a column of per-call numbers where the calls
of a batch differ.  Which of those a batch needs is its *variant* (with the
numbers that all its calls share); a program is compiled once per variant,
as a CachedOp in imperative scopes (``run.executors.run_program``) or inlined in
the plan's symbol in compiled ones.
"""
import itertools
import threading

import numpy as np

from ..ir.graph import Slot
from ..ir.known import exact_scalar
from ..ir.rules import BROW, ROW, SHARED, ZERO_GRADIENT_INPUTS, Rule, call_as_recorded, \
    intern, keeps_outputs, zero_gradient

# "own": the rule's batched call, right on one call's rows as on many (``Rule.program_form``).
_SEGMENT, _RESHAPE, _ROWS, _OWN = "segment", "reshape", "rows", "own"


class _Entry:
    """One operator of a program: what ``call_as_recorded`` and the rules read."""

    __slots__ = ("op", "args", "kwargs", "out_shapes", "out_dtypes", "dtype", "rule", "form",
                 "sources", "brow", "blocks", "scalar", "low")

    def __init__(self, op, args, kwargs, info, form, sources, brow, blocks, scalar, low):
        self.op, self.args, self.kwargs = op, args, kwargs
        self.out_shapes = info.out_shapes    # of the first concrete call: tails are read
        self.out_dtypes = info.out_dtypes
        self.dtype = info.out_dtypes[0]
        self.rule = info.rule
        self.form = form                # "rows", "segment" or "reshape" (entry_kind)
        self.sources = sources          # ("in", position) or ("e", entry, output)
        self.brow = brow                # input positions with the BROW role
        self.blocks = blocks            # positions of parameters shared as blocks (_shared_block)
        self.scalar = scalar            # its number is per call (_scalar_form), not constant
        self.low = low                  # (position, shape) of lower-rank values of each call


class Program:
    """The abstract program of a child block's calls, shared by their row counts.

    Attributes
    ----------
    uid : int
        Small id, unique in this process; part of signatures and plan keys.
    name : str
        ``"call:<block class>"`` of the block first seen with this program.
    num_inputs : int
        Array inputs of a call node: row arguments, shared arguments, then
        the parameters and constants the block reads.
    """

    path = None          # call_as_recorded runs it through ``run``

    def __init__(self, uid, name, entries, exports, num_inputs):
        self.uid = uid
        self.name = name
        self.entries = entries
        self.exports = exports
        self.num_inputs = num_inputs
        self.compiled = threading.local()   # CachedOps of its variants (``run.executors``)
        # Columns of a call's site_rows holding a BROW input's rows (the next
        # column holds its output's rows) and a segment's count; and what
        # compiled plans keep (repeats, segment sums) once needed.
        cols, counts, col = [], [], 0
        for entry in entries:
            cols += [col + 2 * k for k in range(len(entry.brow))]
            col += 2 * len(entry.brow)
            if entry.form == _SEGMENT:
                counts.append(col)
                col += 1
        self.have_cols = np.array(cols, dtype=np.int64)
        self.count_cols = np.array(counts, dtype=np.int64)
        self.sticky = np.zeros(len(cols), dtype=bool)
        self.sticky_sums = np.zeros(len(counts), dtype=bool)
        self.detached = _detached_inputs(entries, exports)
        self.sticky_columns = np.zeros(sum(e.scalar for e in entries), dtype=bool)
        self.batches = {}   # (CallInfo, node count) -> batch_arrays of one call shape

    def __repr__(self):
        return "Program(%s, %d entries)" % (self.name, len(self.entries))

    def run(self, F, inputs, info):
        """One call, unbatched: every entry called as recorded (the reference);
        ``info`` (the call's ``ProgramInfo``) gives its scalar numbers."""
        results = []
        numbers = iter(info.scalars)
        for entry in self.entries:
            ins = [inputs[s[1]] if s[0] == "in" else results[s[1]][s[2]]
                   for s in entry.sources]
            if entry.scalar:
                results.append([_scalar_call(F, entry, ins[0], next(numbers))])
            elif entry.form in (_RESHAPE, _OWN):    # the call's own rows: (-1,) + tail
                results.append(entry.rule.batched_call(F, entry, ins))
            else:
                results.append(call_as_recorded(F, entry, ins))
        return [results[j][idx] for j, idx in self.exports]

    def batched(self, F, inputs, variant):
        """N calls at once: ``inputs`` batched along axis 0, then the index arrays.

        ``variant`` says, per BROW input of the program in order, whether it
        is repeated through an index array, per segment entry whether it
        sums (reading a padded index, and ``mean`` its counts too) or, every
        call's count being 1, passes its input on, and per scalar entry the
        number every call shares, or None to read a column of them.
        """
        extra = iter(inputs[self.num_inputs:])
        flags = iter(variant)
        results = []
        for entry in self.entries:
            ins = [inputs[s[1]] if s[0] == "in" else results[s[1]][s[2]]
                   for s in entry.sources]
            for pos, shape in entry.low:    # each call's (H,) as its row (1, H), a BROW
                ins[pos] = F.reshape(ins[pos], shape=(-1,) + (1,) * (
                    len(entry.out_shapes[0]) - 1 - len(shape)) + shape)
            for pos in entry.brow:
                if next(flags):
                    ins[pos] = F.take(ins[pos], next(extra), axis=0)
            if entry.form == _SEGMENT:
                if not next(flags):             # one row per call: nothing to sum
                    tail = tuple(entry.out_shapes[0][1:])
                    results.append([F.reshape(ins[0], shape=(-1,) + tail)])
                    continue
                ins.extend(next(extra) for _ in range(entry.rule.extra_count(entry.op.name)))
            if entry.scalar:
                number = next(flags)
                column = next(extra) if number is None else None
                results.append([_scalar_call(F, entry, ins[0], number, column)])
                continue
            if entry.blocks:
                results.append(_block_call(F, entry, ins))
                continue
            results.append(entry.rule.batched_call(F, entry, ins))
        # After the exports: every output of calls a graph must hold whole
        # (``rules.keeps_outputs``); callers read the exports only.
        return [results[j][idx] for j, idx in self.exports] + [
            out for entry, outs in zip(self.entries, results)
            if keeps_outputs(entry.op.name, entry.kwargs) for out in outs]


def _detached_inputs(entries, exports):
    """Positions of the program's inputs whose gradient is zero: every entry
    reading them is zero-gradient (``zeros_like``, ``BlockGrad``, comparisons,
    ``argmax``) or feeds only such entries (an index array reshaped, then
    blocked), and exports nothing.  They are gathered outside autograd (see
    ``run._gather_detached``)."""
    exported = {j for j, _ in exports}
    readers = {}                        # ("in", position) or entry index -> reader entries
    for k, entry in enumerate(entries):
        zero_inputs = ZERO_GRADIENT_INPUTS.get(entry.op.name, ())
        for slot, source in enumerate(entry.sources):
            key = ("in", source[1]) if source[0] == "in" else source[1]
            using = readers.setdefault(key, [])
            if slot not in zero_inputs:     # (of a shape or an index, no gradient flows back)
                using.append(k)
    free = [False] * len(entries)       # no gradient flows back through entry k
    for k in reversed(range(len(entries))):
        entry = entries[k]
        free[k] = zero_gradient(entry.op.name, entry.args, entry.kwargs) or (
            k not in exported and all(free[r] for r in readers.get(k, ())))
    return frozenset(key[1] for key, using in readers.items()
                     if type(key) is tuple and all(free[r] for r in using))


class ProgramInfo:
    """The ``calls.CallInfo`` of a program node: one per concrete call shape.

    Besides what every call's analysis holds, ``site_rows`` are the row
    counts ``ProgramRule.batch_arrays`` reads (each BROW input's and its
    output's, each segment's count), ``scalars`` and ``scalar_rows`` the
    call's numbers of its scalar entries and their rows, and ``inputs`` the
    refs of the node's inputs in order: ``("a", k)`` argument k, ``("x", k)``
    parameter k.
    """

    __slots__ = ("out_shapes", "out_dtypes", "attrs", "rule", "meta", "kind", "sig",
                 "shared_pos", "cacheable", "stateful", "link", "site_rows", "inputs",
                 "scalars", "scalar_rows", "usage")
    low = ()        # a program is no broadcast (``calls.CallInfo.low``)

    def __init__(self, op, roles, out_shapes, out_dtypes, site_rows, inputs, scalars=(),
                 scalar_rows=()):
        self.out_shapes, self.out_dtypes = out_shapes, out_dtypes
        self.attrs = ("call", op.uid)
        self.rule = PROGRAM_RULE
        self.meta = roles
        self.kind = "op"
        self.shared_pos = tuple(k for k, role in enumerate(roles) if role == SHARED)
        self.sig = intern(("call", op.uid, roles))
        self.cacheable = True
        self.stateful = self.link = False
        self.site_rows = site_rows
        self.inputs = inputs
        self.scalars = scalars              # this call's number per scalar entry
        self.scalar_rows = scalar_rows      # and the rows it applies to
        self.usage = None                   # the usage.Usage of the block calling it


MAX_BATCHES = 512
"""Batches of one call shape whose index arrays a program keeps."""


class ProgramRule(Rule):
    """Batches call nodes of one program (see the module docstring)."""

    batching = "program"

    def signature(self, node):     # call nodes come with their CallInfo
        raise NotImplementedError("call nodes are signed when their template is built")

    def batch_arrays(self, nodes, sticky=False):
        """(variant, index arrays) of a batch of call nodes, from their row counts.

        With ``sticky`` (compiled plans), a repeat that the program needed in
        any earlier batch is kept (as an identity where no call needs it), so
        that batches of the same shape keep the same plan key.
        """
        op = nodes[0].op
        if not sticky:
            # One call shape among the nodes, the common case: the arrays depend
            # on it and the node count alone, so a batch of the same size reuses
            # them (a scope whose samples read values walks a plan per read).
            info = nodes[0].info
            for node in nodes:
                if node.info is not info:
                    break
            else:
                key = (info, len(nodes))
                found = op.batches.get(key)
                if found is None:
                    if len(op.batches) >= MAX_BATCHES:
                        op.batches.clear()
                    found = op.batches[key] = self._batch_arrays(op, nodes, False)
                return found[0], list(found[1])
        return self._batch_arrays(op, nodes, sticky)

    @staticmethod
    def _batch_arrays(op, nodes, sticky):
        # Few call shapes among many nodes: one row per distinct CallInfo, then
        # picked per node (cheaper than converting every node's tuple).
        distinct = {}
        codes = [distinct.setdefault(n.info, len(distinct)) for n in nodes]
        table = np.array([info.site_rows for info in distinct], dtype=np.int64)
        rows = table.reshape(len(distinct), -1)[codes]
        need = (rows[:, op.have_cols] != rows[:, op.have_cols + 1]).any(axis=0)
        sums = (rows[:, op.count_cols] != 1).any(axis=0)
        if sticky:
            need |= op.sticky
            op.sticky = need
            sums |= op.sticky_sums
            op.sticky_sums = sums
        numbers, columns = _scalar_columns(op, list(distinct), codes, sticky)
        variant, arrays, col, site, seg, scalar = [], [], 0, 0, 0, 0
        padded = {}     # ragged sums over the same rows (a cell's two) share their arrays
        for entry in op.entries:
            for _ in entry.brow:
                repeat = bool(need[site])
                variant.append(repeat)
                if repeat:
                    arrays.append(_repeat_index(rows[:, col], rows[:, col + 1]))
                col += 2
                site += 1
            if entry.scalar:
                variant.append(numbers[scalar])
                if numbers[scalar] is None:
                    arrays.append(columns[scalar])
                scalar += 1
                continue
            if entry.form == _SEGMENT:
                summing = bool(sums[seg]) or not entry.rule.passes_single
                variant.append(summing)
                seg += 1
                if summing:
                    counts = rows[:, col]
                    key = (counts.tobytes(), entry.op.name, len(entry.out_shapes[0]) - 1,
                           entry.dtype)
                    found = padded.get(key)
                    if found is None:
                        found = padded[key] = entry.rule.arrays_for_counts(counts, *key[1:])
                    arrays += found
                col += 1
        return tuple(variant), arrays

    def batched_call(self, F, node, inputs, variant=()):
        return node.op.batched(F, inputs, variant)


PROGRAM_RULE = ProgramRule()

#: Scalar arithmetic a program may hold with a number of each call's own, and
#: the broadcast operator (and operand order) that applies a column of them.
SCALAR_FORMS = {"_plus_scalar": ("broadcast_add", False),
                "_minus_scalar": ("broadcast_sub", False),
                "_rminus_scalar": ("broadcast_sub", True),
                "_mul_scalar": ("broadcast_mul", False),
                "_div_scalar": ("broadcast_div", False)}


def _scalar_columns(op, infos, codes, sticky):
    """Per scalar entry of ``op``: the number all calls share (else None), and
    the column of each call's number repeated over its rows (else None)."""
    count = len(op.sticky_columns)
    if not count:
        return (), ()
    first = infos[0].scalars
    if not op.sticky_columns.any() and all(info.scalars == first for info in infos[1:]):
        return first, (None,) * count          # the usual case: one number each
    values = np.array([info.scalars for info in infos], dtype=np.float64)[codes]
    rows = np.array([info.scalar_rows for info in infos], dtype=np.int64)[codes]
    bits = values.view(np.int64)            # (-0.0 is not 0.0; a NaN is itself)
    differ = (bits != bits[:1]).any(axis=0)
    if sticky:
        differ |= op.sticky_columns
        op.sticky_columns = differ
    numbers, columns = [], []
    for k, entry in enumerate(e for e in op.entries if e.scalar):
        if not differ[k]:
            numbers.append(exact_scalar(values[0, k]))
            columns.append(None)
            continue
        shape = (-1,) + (1,) * (len(entry.out_shapes[0]) - 1)
        numbers.append(None)
        columns.append(np.repeat(values[:, k], rows[:, k]).astype(entry.dtype).reshape(shape))
    return numbers, columns


def _scalar_call(F, entry, x, number, column=None):
    """Scalar entry ``entry`` on ``x``: with ``number`` (its own or all calls'),
    or with ``column`` (per row) through the broadcast operator."""
    if column is None:
        return getattr(F._internal, entry.op.name)(x, scalar=number)
    name, reflected = SCALAR_FORMS[entry.op.name]
    args = (column, x) if reflected else (x, column)
    return getattr(F, name)(*args)


def takes_number(op, args, kwargs, info):
    """Whether a call is a scalar entry whose number may differ per call (``x / n``)."""
    return _scalar_form(op, args, kwargs, entry_kind(op, info), info) is not None


def _scalar_form(op, args, kwargs, kind, info):
    """The number of a scalar entry that may differ per call, or None: one of
    ``SCALAR_FORMS`` on one float array, the number its only constant."""
    if kind != _ROWS or op.name not in SCALAR_FORMS \
            or np.dtype(info.out_dtypes[0]) not in (np.float32, np.float64):
        return None
    consts = [a for a in args if type(a).__name__ != "Slot"]
    if set(kwargs) - {"scalar"} or len(consts) + len(kwargs) != 1:
        return None
    number = consts[0] if consts else kwargs["scalar"]
    return exact_scalar(number) if isinstance(number, (int, float)) else None


def _block_call(F, entry, ins):
    """A ``broadcast_*`` entry with parameters of each call's whole shape over
    N calls' rows: the rows laid out (N, rows, ...), each such parameter as one
    (1, rows, ...) block (see ``_shared_block``)."""
    rows = entry.out_shapes[0][0]
    ins = [F.reshape(x, shape=(-4, 1, -1, -2)) if p in entry.blocks
           else F.reshape(x, shape=(-4, -1, rows, -2)) for p, x in enumerate(ins)]
    return [F.reshape(out, shape=(-3, -2)) for out in call_as_recorded(F, entry, ins)]


def _repeat_index(have, want):
    """Rows of a BROW input: its own where ``have == want``, else its one row repeated."""
    starts = np.cumsum(have) - have
    total = int(want.sum())
    within = np.arange(total) - np.repeat(np.cumsum(want) - want, want)
    same = np.repeat(have == want, want)
    return (np.repeat(starts, want) + within * same).astype(np.int32)


# -- building call templates ------------------------------------------------------------

_PROGRAMS = {}
_PROGRAMS_LOCK = threading.Lock()
_UIDS = itertools.count()
MAX_PROGRAMS = 4096


def entry_kind(op, info):
    """How an entry batches inside a program, or None if it keeps a call out."""
    if info.kind != "op" or info.sig is None or info.stateful:
        return None
    if any(len(shape) == 0 for shape in info.out_shapes):
        return None
    return _FORMS.get(info.rule.program_form)


_FORMS = {"rows": _ROWS, "segment": _SEGMENT, "reshape": _RESHAPE, "own": _OWN}


def _roles(kind, info):
    return (ROW,) if kind in (_SEGMENT, _RESHAPE) else tuple(info.meta)


def build(entries, exports, arg_shapes, name, param_shapes=()):
    """The ``(Program, ProgramInfo)`` of a template's calls, or None if they must
    stay per operator.

    Parameters
    ----------
    entries : tuple
        ``(op, args, kwargs, refs, info, path)`` per call, refs ``("a", k)``
        argument k, ``("n", j, idx)`` output idx of entry j or ``("x", k)``
        parameter k.
    exports : list of (int, int)
        The ``(j, idx)`` the node outputs, in order.
    arg_shapes : list of tuple
        Shapes of the arguments.
    name : str
        Class name of the block, for ``Program.name``.
    param_shapes : sequence of tuple, optional
        Shape of parameter k: a one-row parameter broadcast over a call's rows
        (``x * v`` with ``v`` of shape (1, H)), or a 1-d parameter added to
        1-d values of its length (``W . x + b``), is shared by the batched call.
    """
    arg_role, kinds, rows_of = {}, [], {}
    for j, (op, _args, _kwargs, refs, info, _path) in enumerate(entries):
        kind = entry_kind(op, info)
        if kind is None:
            return None
        kinds.append(kind)
        low = _own_low(info, refs)
        for p, (ref, role) in enumerate(zip(refs, _roles(kind, info))):
            if ref[0] == "x" and _shared_param(op, refs, ref, role, info, param_shapes):
                continue
            if p in low:
                role = ROW      # a lower-rank value of each call: gathered (``Entry.low``)
            if not _use_ok(ref, role, arg_role, arg_shapes):
                return None
        for idx, shape in enumerate(info.out_shapes):
            rows_of[("n", j, idx)] = shape[0]
    for k, role in arg_role.items():
        if role != SHARED:
            rows_of[("a", k)] = arg_shapes[k][0]
    inputs = ([("a", k) for k in sorted(arg_role) if arg_role[k] != SHARED]
              + [("a", k) for k in sorted(arg_role) if arg_role[k] == SHARED]
              + sorted({ref for e in entries for ref in e[3] if ref[0] == "x"}))
    position = {ref: p for p, ref in enumerate(inputs)}
    roles = tuple(ROW if ref in rows_of else SHARED for ref in inputs)
    program, site_rows, scalars, scalar_rows = [], [], [], []
    for (op, args, kwargs, refs, info, _path), kind in zip(entries, kinds):
        entry_roles = _roles(kind, info)
        if kind == _ROWS and not _rows_match(refs, entry_roles, rows_of, info):
            return None
        sources = tuple(("in", position[r]) if r[0] != "n" else ("e", r[1], r[2])
                        for r in refs)
        low = tuple((p, arg_shapes[refs[p][1]] if refs[p][0] == "a"
                     else entries[refs[p][1]][4].out_shapes[refs[p][2]])
                    for p in _own_low(info, refs))
        low_at = dict(low)      # viewed as one row per call, then repeated as BROW rows
        brow = tuple(p for p, role in enumerate(entry_roles)
                     if role == BROW and refs[p][0] != "x" or p in low_at)
        blocks = tuple(p for p, role in enumerate(entry_roles) if refs[p][0] == "x"
                       and _shared_block(op, refs, refs[p], role, info, param_shapes))
        for p in brow:
            site_rows += [1 if p in low_at else rows_of[refs[p]], info.out_shapes[0][0]]
        if kind == _SEGMENT:
            site_rows.append(rows_of[refs[0]])
        number = _scalar_form(op, args, kwargs, kind, info)
        if number is not None:
            scalars.append(number)
            scalar_rows.append(info.out_shapes[0][0])
        program.append((op, args, kwargs, info, kind, sources, brow, blocks, number is not None,
                        low))
    exports = tuple(exports)
    if not exports:
        return None
    op = _intern(program, exports, roles, name)
    out_shapes = tuple(entries[j][4].out_shapes[idx] for j, idx in exports)
    out_dtypes = tuple(entries[j][4].out_dtypes[idx] for j, idx in exports)
    return op, ProgramInfo(op, roles, out_shapes, out_dtypes, tuple(site_rows), tuple(inputs),
                           tuple(scalars), tuple(scalar_rows))


def _own_low(info, refs):
    """Positions of a broadcast's lower-rank inputs that are values of each call
    (``CallInfo.low``), not parameters."""
    return [p for p in info.low if refs[p][0] != "x"]


def _use_ok(ref, role, arg_role, arg_shapes):
    """Whether value ``ref`` may be used with ``role`` (recording args' roles)."""
    want = SHARED if role == SHARED else ROW
    if ref[0] == "x":
        return want == SHARED          # parameters and constants are never row data
    if ref[0] == "n":
        return want == ROW             # a computed weight would differ per call
    if want == ROW and not arg_shapes[ref[1]]:
        return False
    return arg_role.setdefault(ref[1], want) == want


def _shared_param(op, refs, ref, role, info, param_shapes):
    """Whether parameter ``ref`` is passed once to a batch of an entry although
    its role is not SHARED: a one-row BROW (``_shared_row``) or a block of each
    call's shape (``_shared_block``)."""
    return (role == BROW and _shared_row(op, ref, param_shapes)) \
        or _shared_block(op, refs, ref, role, info, param_shapes)


def _shared_row(op, ref, param_shapes):
    """Whether parameter ``ref``, a broadcast row of ``op``, is one row that a
    ``broadcast_*`` operator spreads over any number of rows."""
    k = ref[1]
    return op.name.startswith("broadcast_") and k < len(param_shapes) \
        and len(param_shapes[k]) > 0 and param_shapes[k][0] == 1


# Element-wise operators of two arrays broadcast both ways (not ``broadcast_like``).
_BROADCAST_BINARY = frozenset("""broadcast_add broadcast_sub broadcast_mul broadcast_div
broadcast_plus broadcast_minus broadcast_maximum broadcast_minimum broadcast_power
broadcast_hypot broadcast_mod""".split())


def _shared_block(op, refs, ref, role, info, param_shapes):
    """Whether parameter ``ref`` has each call's whole output shape and a binary
    ``broadcast_*`` operator combines it with a value of each call: a 1-d
    vector (``W . x + b`` on vectors) or a matrix (a CRF's transitions added
    to each call's (C, C) scores).  Batched as (N, rows, ...) against one
    (1, rows, ...) block."""
    k = ref[1]
    shape = info.out_shapes[0]
    return role != SHARED and op.name in _BROADCAST_BINARY and len(refs) == 2 \
        and any(r[0] != "x" for r in refs) and shape and shape[0] > 1 \
        and k < len(param_shapes) and param_shapes[k] == shape


def _rows_match(refs, roles, rows_of, info):
    """ROW inputs have the output's rows; BROW ones too, or a single row
    (parameters in a BROW role are one shared row: ``_shared_row``)."""
    out_rows = info.out_shapes[0][0]
    for ref, role in zip(refs, roles):
        if ref[0] == "x":
            continue
        if role == ROW and rows_of[ref] != out_rows:
            return False
        if role == BROW and rows_of[ref] not in (out_rows, 1):
            return False
    return True


def _intern(program, exports, roles, name):
    """The Program of a program, shared by every template with the same abstract form."""
    # Constant arguments are part of the key even where signatures leave them
    # out (a reshape's target shape), so ``Program.run`` is exact for every call.
    # A scalar entry's number is the call's own (``ProgramInfo.scalars``), and a
    # reshape keeps each call's rows (its target's first axis is theirs): their
    # keys hold the trailing shapes and dtypes their signatures would.  A
    # reshape's signature holds its input's trailing shape as well: the batch
    # concatenates the inputs, so a (1, T, H) sentence read as (T, H) rows
    # batches only with sentences of its length.
    # A block entry's calls lay their rows out by its output's rows (``_block_call``):
    # its key holds them.
    # Where each input goes in the call (``F.dot(h, w)``, ``F.dot(rhs=w, lhs=h)``) too.
    key = (tuple((op.path, kind, sources, blocks, low, _slot_layout(args, kwargs))
                 + (("rows", tuple(s[1:] for s in info.out_shapes), info.out_dtypes)
                    + ((info.sig,) if kind == _RESHAPE else ())
                    if scalar or kind == _RESHAPE else (info.attrs, info.sig))
                 + ((info.out_shapes[0][0],) if blocks else ())
                 for op, args, kwargs, info, kind, sources, _b, blocks, scalar, low in program),
           exports, roles)
    with _PROGRAMS_LOCK:
        found = _PROGRAMS.get(key)
        if found is None:
            if len(_PROGRAMS) >= MAX_PROGRAMS:
                _PROGRAMS.clear()       # rare; live templates keep their programs
            entries = tuple(_Entry(*spec) for spec in program)
            found = _PROGRAMS[key] = Program(next(_UIDS), "call:" + name, entries,
                                            exports, len(roles))
    return found


def _slot_layout(args, kwargs):
    """Which argument of a call each of its inputs is: ``(place, input)`` per
    positional slot and ``(name, input)`` per keyword slot."""
    return (tuple([(k, a.k) for k, a in enumerate(args) if type(a) is Slot]),
            tuple(sorted((name, v.k) for name, v in kwargs.items() if type(v) is Slot))
            if kwargs else ())


def shared_signature(info, external):
    """The signature of call nodes of ``info`` when all their SHARED inputs are
    ``external`` values (parameters, constants), else None (see ``make_node``)."""
    if info.sig is None or info.stateful or info.kind != "op":
        return None
    if not info.shared_pos:
        return info.sig
    refs = [info.inputs[k] for k in info.shared_pos]
    if any(ref[0] != "x" for ref in refs):
        return None
    return (info.sig, tuple([(external[ref[1]][0].id, external[ref[1]][1]) for ref in refs]))
