"""Grafts: a child-block call learned on one path, copied onto another.

A frame learns a child block's call (an ``rnn.LSTMCell`` step) by tracing
its Python code, analysing each operator (tens of microseconds each), once
per state of the block's trie: once per path.  Where paths rarely repeat
(each word's character count, which words a shared cache already held,
the positions a pointer network reads), every sample would trace its cells
again.  The calls a block makes depend only on the shapes of its arguments
(what a :class:`Macro` already assumes), so the calls learned on one path
are kept, relative to the call's first position, and copied as new states
onto the next path that makes the same call from the same place in the
user's code: no tracing, no analysis.

A frame's grafts are kept with the root of its trie, like its recipes: per
thread, and dropped with the block.  Only plain calls are kept: arguments
that are arrays without bases or known values (an array passed twice is part
of the key), made by the frame's own call (not inside another child block),
a trace that read nothing else from outside and returns new values or its
arguments.
"""
from mxnet.ndarray import NDArray

from . import sites
from .lazy import LazyArray
from .trie import MAX_STATES, LearnedCall, Macro, State, flatten_args

MAX_GRAFTS = 4096       # grafts (and recipes) kept per template trie


class Graft:
    """A child block's learned calls, relative to its arguments and first position."""

    __slots__ = ("steps", "outputs", "shapes", "dtypes")

    def __init__(self, steps, outputs, shapes, dtypes):
        self.steps, self.outputs = steps, outputs
        self.shapes, self.dtypes = shapes, dtypes


def arrays_of(args, key):
    """``(arrays, refs)``: the call's arrays (nested arguments flattened, as
    ``Frame.block_call`` keys them) and their key items."""
    if len(key) == len(args) + 1 and all(isinstance(a, NDArray) for a in args):
        return args, key[1:]
    return flatten_args(args)[0] or (), key[2:]


def key_of(frame, args, key):
    """The graft key of child-block call ``key`` with ``args``, or None."""
    if frame.call_start is not None or frame.direct or not frame.rec.replay:
        return None
    args, refs = arrays_of(args, key)
    if len(args) != len(refs):
        return None
    items = [key[1]] if len(refs) + 1 < len(key) else []     # the nesting, if any
    for a, ref in zip(args, refs):
        if not isinstance(a, NDArray) or type(a) is LazyArray and a._base is not None:
            return None
        if type(ref) is int:
            items.append((frame.out_shapes[ref], frame.out_dtypes[ref]))
        elif ref[0] == "x" and not (len(ref) > 3 and ref[3]):
            items.append(ref[1:3])
        else:
            return None
    pos = _array_positions(frame, args, refs)
    aliases = tuple(pos.index(p) for p in pos)     # an array passed twice is one value
    return ("graft", key[0], frame.rec.mode, tuple(items), aliases,
            sites.capture(frame.caller))


def _positions(frame, args, key):
    """The position of each array argument of call ``key``."""
    return _array_positions(frame, *arrays_of(args, key))


def _array_positions(frame, arrays, refs):
    """The position of each array (read from outside ones have one by now)."""
    return [ref if type(ref) is int else frame.ext[id(a)] for a, ref in zip(arrays, refs)]


def remember(frame, gkey, args, key, before, start):
    """Keep the calls just learned for ``key`` at ``before`` under ``gkey``."""
    macro = before.calls.get(key)
    kept = before.root().recipes
    if macro is None or macro.bases is not None or macro.reads or len(kept) >= MAX_GRAFTS:
        return
    where = {pos: ("a", k) for k, pos in enumerate(_positions(frame, args, key))}

    def rel(pos):
        return ("n", pos - start) if pos >= start else where.get(pos)

    steps = []
    state, inner = macro.target, before.next.get(("enter", key))
    while state is not inner and state is not None:
        step = state.step
        if step is not None:
            if step.call != start:
                return
            refs = tuple(rel(r) if type(r) is int else ("k", r) for r in step.refs)
            if any(r is None for r in refs):
                return
            steps.append((step, refs))
        state = state.parent
    if state is None:
        return
    outputs = _relative(macro.outputs, rel)
    if outputs is not None:
        kept[gkey] = Graft(steps[::-1], outputs, macro.shapes, macro.dtypes)


def _relative(obj, rel):
    if obj[0] == "v":
        return obj
    if obj[0] == "pos":
        found = rel(obj[1])
        return None if found is None else ("pos", found)
    inner = [_relative(o, rel) for o in obj[1]]
    return None if any(i is None for i in inner) else (obj[0], inner)


def find(frame, gkey):
    """The graft kept under ``gkey`` for ``frame``'s block, or None."""
    return frame.state.root().recipes.get(gkey)


def apply(frame, graft, args, key, before):
    """Copy ``graft`` onto the frame's path at ``before`` for ``key``; the call's
    outputs (as a replay of the macro it makes), or None when the trie is full."""
    if before.counter[0] + len(graft.steps) + 1 >= MAX_STATES:
        return None
    start = len(frame.out_shapes)
    argpos = _positions(frame, args, key)

    def absolute(ref):
        kind, value = ref
        if kind == "n":
            return start + value
        if kind == "a":
            return argpos[value]
        return value

    state = before.next.get(("enter", key))
    if state is None:
        state = before.next[("enter", key)] = State(None, before, before.start)
    for j, (step, refs) in enumerate(graft.steps):
        copy = LearnedCall(step.op, step.args, step.kwargs, tuple(absolute(r) for r in refs),
                           step.info, tuple(start + pos - step.call for pos in step.outs),
                           step.path)
        copy.site, copy.call = step.site, start
        nxt = State(copy, state, state.start)
        state.next[("graft", j)] = nxt
        state = nxt
    outputs = _absolute(graft.outputs, absolute)
    macro = before.calls[key] = Macro(state, graft.shapes, graft.dtypes, outputs, start)
    arrays, refs = arrays_of(args, key)
    return frame._replay(macro, arrays, refs)  # pylint: disable=protected-access


def _absolute(obj, absolute):
    if obj[0] == "v":
        return obj
    if obj[0] == "pos":
        return ("pos", absolute(obj[1]))
    return (obj[0], [_absolute(o, absolute) for o in obj[1]])
