"""Frames: a DynBatchBlock call recorded as a path through a trie of templates.

A *frame* is one run of a DynBatchBlock's ``hybrid_forward``: one tree node,
one sentence.  Inside a frame, operator calls and child-block calls build no
graph nodes.  Each call is described by a *key* (the operator, its constant
arguments, and where each array input comes from: a position of this frame,
a parameter, a constant) and advances the frame along a trie of keys shared
by all frames of the block (``State``).  A known key costs one dictionary
lookup: the trie edge already holds the call's output shapes.  An unknown one
is analysed once (shape inference, batching rule) and becomes a new edge.

Values of a frame are numbered by *position*: outputs of its calls, and the
arrays it reads from outside (arguments, outputs of nested frames, views),
numbered when first read.  Until the frame ends, the LazyArrays of its
outputs are provisional: their ``_node`` is the frame itself.

When ``hybrid_forward`` returns, the values a caller can still reach (found
by reference count) are the frame's exports.  The path and the exports
select a *recipe* (``templates.py``), built once: usually one program node
for the whole frame, compiled once for all frames of that template.  The
provisional LazyArrays then take their places in the graph.

A frame is *cut* -- what it recorded so far goes into the graph -- when
anything else needs one of its values (a nested frame's arguments, a read, a
block with hooks); recording goes on in a new segment.  A frame that meets
something templates cannot describe falls back: it is cut and the rest of its
calls are recorded one node per operator, as outside frames.
"""
import itertools
import inspect

import numpy as np
from mxnet.ndarray import NDArray

from . import grafts
from . import literals
from . import sites
from . import weights as weight_calls
from .alone import run_alone
from ..ir.calls import ShapeFromData
from ..ir.graph import LEAF
from ..ir.known import scalars_as
from ..ir.ops import opdef, positional
from .lazy import LazyArray
from .literals import key_item
from ._core import FrameCore, apply_recipe
from .bases import base_of, bases_made, replay_bases
from .trie import MAX_STATES, Macro, State, flatten_args, holds_array, learn_call

NOT_RECORDED = object()    # ``Frame.block_call``: the call is left to the caller
#: Numbers one operator has met at one place of the user's code before its
#: later numbers there come as literal arrays (``Frame._varying_number``).
VARYING_NUMBERS = 3
#: Paths learned at one place of the code where numbers differ (two signs, in a
#: loop: ``h * sign``), after which its numbers come as literal arrays too: each
#: path through the loop is a combination of numbers, a new one nearly per sample.
VARYING_PATHS = 8
_NUMBERS_SEEN = {}          # (op, place in the code) -> [numbers met there, paths learned]
_FLOATS_SEEN = {}           # (block token, place, structure) -> [float arguments, paths]
# Scalar operators, the broadcast taking their number as an array, and whether
# the number comes first (``1.0 - x``, ``1.0 / x``).
_NUMBER_AS_ARRAY = {"_plus_scalar": ("broadcast_add", False),
                    "_minus_scalar": ("broadcast_sub", False),
                    "_rminus_scalar": ("broadcast_sub", True),
                    "_mul_scalar": ("broadcast_mul", False),
                    "_div_scalar": ("broadcast_div", False),
                    "_rdiv_scalar": ("broadcast_div", True)}
MAX_WRITTEN = 64           # calls as written learned per trie state
#: A frame about to learn an operator call at a state where ``CUT_BRANCHES`` or
#: more calls were learned, ``CUT_DEPTH`` or more calls into its segment, makes
#: the state a cut point (``Frame._at_cut_point``): every frame reaching it
#: records its next call after a cut.  A loss over a sample's own gold
#: structure after a long computation shared by samples learned a path, and a
#: recipe for the whole computation, per sample; its own short segment now.  (A
#: loop's states have two: its next iteration, and what follows the loop.)
CUT_BRANCHES = 3
CUT_DEPTH = 32


def _varied(table, place, value, paths=None):
    """Whether ``VARYING_NUMBERS`` values were met at ``place`` (of ``table``)
    before, or ``paths`` paths (if given) were learned there with values that
    differ; else ``value`` and the path learning it are noted there."""
    seen = table.get(place)
    if seen is None:
        seen = table[place] = [set(), 0]
    values = seen[0]
    if len(values) >= VARYING_NUMBERS or paths is not None and len(values) > 1 \
            and seen[1] >= paths:
        return True
    values.add(value)
    seen[1] += 1
    return False


def _holds_float(args):
    """Whether ``args`` (nested in lists and tuples) hold a float."""
    for a in args:
        if isinstance(a, float) or type(a) in (list, tuple) and _holds_float(a):
            return True
    return False


def _without_floats(structure):
    """A call's argument structure (``trie.flatten_args``) with each float
    constant replaced by a mark of its place."""
    if structure[0] == "C":
        return ("C", float, None) if isinstance(structure[2], float) else structure
    if structure[0] == "A":
        return structure
    return (structure[0], tuple(_without_floats(item) for item in structure[1]))


class _FrameGraph:
    """What a provisional LazyArray's ``node.graph`` needs to offer."""

    __slots__ = ("ctx", "error", "read_fn")

    def __init__(self, ctx, read_fn):
        self.ctx = ctx
        self.error = None
        self.read_fn = read_fn


class Frame(FrameCore):
    """The recording state of one DynBatchBlock call (see the module docstring).

    The matched path (``op``, ``push``) is compiled (``_core.FrameCore``);
    what is learned, cut or falls back is here.  Attributes read through
    provisional LazyArrays: ``kind`` ("frame"), ``graph`` (a stand-in with
    the context), ``out_shapes`` and ``out_dtypes`` (per position).
    """

    __slots__ = ()
    kind = "frame"
    depth = 0

    @property
    def graph(self):
        """What a provisional LazyArray's ``node.graph`` is asked for (made when asked:
        a frame holding it would be a reference cycle)."""
        return _FrameGraph(self.rec.ctx, self.read)

    # -- keys ---------------------------------------------------------------------
    def ref(self, a, read=True):
        """The key item of array ``a`` read by a call of this frame.

        A value of this frame is its position; a parameter or constant is
        named by identity; any other array gets the next position the first
        time it is read (its key item then carries its shape).  Without
        ``read``, an array not read yet keeps no position (its key item is the
        one a read would give), and None answers a value of another frame.
        """
        if type(a) is LazyArray:
            node = a._node
            if node is self:
                return a._idx
            found = self.ext.get(id(a))
            if found is not None:
                return found
            rec = self.rec
            if node is not None and node.graph is rec.graph and node.kind is not LEAF:
                found = rec.graph.derived.get(node.id)      # a value of weights alone
                if found is not None:
                    return ("p", found[a._idx])
                if not read:
                    return key_item(rec, a, node.out_shapes[a._idx], node.out_dtypes[a._idx])
                return self._read(a, node.out_shapes[a._idx], node.out_dtypes[a._idx])
            if type(node) is Frame:
                if not read:
                    return None
                node.cut("a value of an enclosing call is used here")
        else:
            found = self.ext.get(id(a))
            if found is not None:
                return found
            rec = self.rec
        shared = rec.graph.shared_items
        found = shared.get(id(a))           # a parameter or constant of this graph
        if found is not None:
            return found
        node, _ = rec.value_of(a)
        if node.kind == LEAF:
            if node.param is not None:
                found = ("p", node.param)
            elif id(node.value) in rec.constant_ids:
                found = ("c", id(node.value))
            if found is not None:
                if node.graph is rec.graph and (type(a) is not LazyArray or a._node is node):
                    shared[id(a)] = found       # ``a`` is kept alive by the graph
                return found
        if not read:
            return key_item(rec, a, a.shape, a.dtype)
        return self._read(a, a.shape, a.dtype)

    def _read(self, a, shape, dtype):
        """Give outside array ``a`` the next position; its key item."""
        pos = len(self.out_shapes)
        self.out_shapes.append(shape)
        self.out_dtypes.append(dtype)
        self.vals[pos] = a
        self.ext[id(a)] = pos
        return key_item(self.rec, a, shape, dtype)    # marks values rules may read

    def _op(self, op, args, kwargs):
        if kwargs:
            args, kwargs = positional(op, args, kwargs)     # ``F.dot(rhs=b, lhs=a)``
        if self._on_weights(op, args, kwargs):
            # Weights only: one node per graph, outside templates (weight_calls.py).
            return self.rec.graph_op(op, args, kwargs)
        refs = []
        arrays = 0
        ref = self.ref
        for a in args:
            if type(a) is LazyArray and a._node is self:
                refs.append(a._idx)
                arrays += 1
            elif isinstance(a, NDArray):
                refs.append(ref(a))
                arrays += 1
            else:
                refs.append((type(a), a))      # a constant (a type never names an array)
        kw = None
        if kwargs:
            kw = []
            for item in kwargs.items():
                value = item[1]
                if isinstance(value, NDArray):
                    kw.append((item[0], ref(value)))
                    arrays += 1
                elif item[0] != "name":
                    kw.append(item)
            kw = tuple(kw)
        if not arrays:                         # zeros, random draws: graph leaves
            return self.rec.constant(op, args, kwargs)
        refs = tuple(refs)
        key = (op,) + refs if kw is None else (op, refs, kw)
        try:
            nxt = self.state.next.get(key)
        except TypeError:                     # an unhashable constant argument
            return self.fallback_op(op, args, kwargs, "an unhashable argument")
        if nxt is not None:
            if nxt.single:
                return self.push(nxt)
            return self._outputs(nxt)
        return self.call(op, args, kwargs, key, refs, kw)

    def _on_weights(self, op, args, kwargs):
        """Whether every array of a call is a weight (``weight_calls.is_weight``);
        asked before ``ref`` gives any of them a position."""
        arrays = [a for a in args if isinstance(a, NDArray)]
        if kwargs:
            arrays += [v for v in kwargs.values() if isinstance(v, NDArray)]
        rec = self.rec
        # Most calls read a value of the frame first: ``is_weight`` says no at once.
        return bool(arrays) and all(weight_calls.is_weight(rec, a) for a in arrays) \
            and weight_calls.deterministic(op) and not weight_calls.half_cast(op, args, kwargs)

    def call(self, op, args, kwargs, key, refs, kw):
        """Follow (or learn) the edge of ``key``; the call's outputs.

        ``refs`` and ``kw`` are the key items of the call's arguments (see
        ``ref``); callers with a short path of their own (``lazy_ops``) come
        here when they miss.
        """
        try:
            nxt = self.state.next.get(key)
        except TypeError:                     # an unhashable constant argument
            return self.fallback_op(op, args, kwargs, "an unhashable argument")
        if nxt is None:
            found = self._varying_number(op, args, refs, kw)
            if found is not None:
                return found
            if self._at_cut_point():
                # Keyed anew in the new segment: arrays this call read first go
                # back (their positions would name them there without shapes).
                self._forget_reads(args, kwargs, refs, kw)
                self.cut("a point where the samples' paths part")
                return self.op(op, args, kwargs)
            try:
                nxt = self._learn(op, args, kwargs, key, refs, kw)
            except ShapeFromData:       # its output shape depends on its data
                self._forget_reads(args, kwargs, refs, kw)
                return run_alone(self.rec, op, args, kwargs)
            if nxt is None:
                return self.fallback_op(op, args, kwargs, "a call templates cannot hold")
        return self._outputs(nxt)

    def _at_cut_point(self):
        """Whether the call met here is recorded after a cut: this state is a
        cut point, or is made one now (``CUT_BRANCHES``).  Frames reaching a cut
        point miss its calls and come here: what was learned past it before
        is kept aside, alive (frames may wait at reads on those paths, whose
        states are linked to the trie upwards only weakly), but not followed."""
        state = self.state
        if self.direct:
            return False
        if state.dropped is None:
            if state.depth < CUT_DEPTH \
                    or len(state.next) + len(state.calls) + len(state.written) < CUT_BRANCHES:
                return False
            state.dropped = (dict(state.next), dict(state.calls), dict(state.written))
            state.next.clear()
            state.calls.clear()
            state.written.clear()
        return True

    def _varying_number(self, op, args, refs, kw):
        """``x * number`` (or ``+``, ``-``, ``/``) whose number has changed from call
        to call at this point of the code, as a broadcast with the number as a
        literal array: one path for every number (``VARYING_NUMBERS``); else None.

        A number is part of a call's key, so that each number learns a path of
        its own: a sample's own weight or time step would learn at every call.
        """
        form = _NUMBER_AS_ARRAY.get(op.name)
        if form is None or kw is not None or len(refs) != 2 or type(refs[1]) is not tuple \
                or refs[1][0] is not float or not isinstance(args[0], NDArray):
            return None
        x, number = args[0], refs[1][1]
        if not x.shape or np.dtype(x.dtype).kind != "f":
            return None
        if not _varied(_NUMBERS_SEEN, (op, self._place()), number, VARYING_PATHS):
            return None
        # One row per row of ``x`` (rows batch with rows; a one-row number
        # broadcast over another number of rows would need its own role).
        shape = x.shape[:1] + (1,) * (len(x.shape) - 1)
        # The call's key read ``x`` for the first time, by its shape; no edge
        # keeps that key: the broadcast reads it afresh, so its key has the shape.
        self._forget_reads(args, {}, refs, kw)
        value = literals.record(self.rec, np.full(shape, scalars_as(number, x.dtype)))
        name, reflected = form
        return self.op(opdef(name), (value, x) if reflected else (x, value), {})

    def _forget_reads(self, args, kwargs, refs, kw):
        """Give back the positions the first reads of outside arrays by a call
        took (``ref``) when the call runs outside the templates: no step reads
        them, so frames on the same path must number what they read next alike
        (a frame reading them here and one not reading them at all)."""
        pairs = [(a, r) for a, r in zip(args, refs) if isinstance(a, NDArray)]
        for name, item in kw or ():
            if isinstance(kwargs.get(name), NDArray):
                pairs.append((kwargs[name], item))
        taken = sorted({self.ext[id(a)] for a, r in pairs
                        if type(r) is tuple and r and r[0] == "x" and id(a) in self.ext})
        if not taken:
            return
        end = len(self.out_shapes)
        if taken != list(range(end - len(taken), end)):
            self.cut("a call whose output shape depends on its data")
            return
        for a, _ in pairs:
            if self.ext.get(id(a)) in taken:
                del self.ext[id(a)]
        for pos in taken:
            self.vals.pop(pos, None)
        del self.out_shapes[taken[0]:]
        del self.out_dtypes[taken[0]:]

    def _outputs(self, state):
        """New provisional LazyArrays for the outputs of ``state``'s step."""
        pos = len(self.out_shapes)
        if state.single:
            return self.push(state)
        self.state = state
        info = state.step.info
        self.out_shapes.extend(info.out_shapes)
        self.out_dtypes.extend(info.out_dtypes)
        outs = [self.new_lazy(pos + k) for k in range(len(info.out_shapes))]
        self.lazies.extend(outs)
        return outs

    def _learn_step(self, op, args, kwargs, refs, kw):
        """The :class:`LearnedCall` of a call, with its place in the user's code.

        The operators of one child-block call share the place of that call
        (``step.call`` tells them from those of the next call at that place).
        """
        step = learn_call(self.rec, self, op, args, kwargs, refs, kw)
        step.site = sites.capture(self.caller)
        step.call = self.call_start if self.call_start is not None else len(self.out_shapes)
        return step

    def _learn(self, op, args, kwargs, key, refs, kw):
        """Analyse a call met for the first time here; the new state, or None."""
        step = self._learn_step(op, args, kwargs, refs, kw)
        if not step.info.cacheable and not step.info.stateful:
            # The first call of a parameter with deferred initialisation gave
            # it its shape; analysed again, the call is like any other.
            step = self._learn_step(op, args, kwargs, refs, kw)
        if step.info.stateful or not step.info.cacheable:
            return None
        counter = self.state.counter
        if counter[0] >= MAX_STATES:
            return None
        nxt = State(step, self.state, self.state.start)
        self.state.next[key] = nxt
        return nxt

    # -- child blocks -----------------------------------------------------------
    def block_call(self, block, args):
        """Record a child HybridBlock call inside this frame; its outputs.

        A call of a known shape moves the frame along a :class:`Macro` without
        running the block's Python code.  Returns ``NOT_RECORDED`` when the
        call cannot be part of a template (the caller then falls back).
        """
        for a in args:
            if not isinstance(a, NDArray):
                break
        else:                                   # only arrays: the common case
            refs = tuple([a._idx if type(a) is LazyArray and a._node is self
                          else self.ref(a) for a in args])
            key = (self.rec.block_token(block),) + refs
            macro = self.state.calls.get(key)
            if macro is not None:
                return self._replay(macro, args, refs)
            return self._learn_block(block, args, key)
        arrays, structure = flatten_args(args)
        if structure is None:
            return NOT_RECORDED
        refs = tuple([self.ref(a) for a in arrays])
        key = (self.rec.block_token(block), structure) + refs
        macro = self.state.calls.get(key)
        if macro is not None:
            return self._replay(macro, arrays, refs)
        return self._learn_block(block, args, key)

    def _replay(self, macro, arrays, refs):
        """Follow ``macro``: the call's outputs, without running its code (a child
        block's, or a call a pass rewrote: ``written``)."""
        start = len(self.out_shapes)
        self.out_shapes.extend(macro.shapes)
        self.out_dtypes.extend(macro.dtypes)
        self.state = macro.target
        for k, pos in macro.reads:          # arrays the call read from outside first
            self.vals[pos] = arrays[k]
            self.ext[id(arrays[k])] = pos
        simple = macro.simple
        if simple is None:
            given = {ref: a for a, ref in zip(arrays, refs) if type(ref) is int}
            for k, pos in macro.reads:
                given[pos] = arrays[k]
            for a in arrays:                # an argument's base, handed back
                base = base_of(a)
                if base is not None and base._node is self:
                    given.setdefault(base._idx, base)
            out = self.build_out(macro.outputs, start, given)
        elif simple[0] is None:
            out = self.new_lazy(start + simple[1])
            self.lazies.append(out)
        else:
            out = simple[0]([self.new_lazy(start + k) for k in simple[1]])
            self.lazies.extend(out)
        if macro.bases is not None:         # outputs that reshape values of the call
            replay_bases(self, out, macro.bases, arrays)
        return out

    def _learn_block(self, block, args, key):
        """Trace a child-block call met for the first time here; learn its macro.

        The trace starts from a state of its own, reached by the call's key:
        the key may read arrays for the first time, and the shapes it gives
        them must be part of the path the block's calls are learned on.
        """
        if not holds_array(args):
            if not args:
                try:
                    inspect.signature(block.forward).bind()
                except TypeError:
                    # Python's own error of the missing argument, as eager's call
                    # raises (binding fails before the method's body runs).
                    block.forward()
            # As ``HybridBlock.forward`` refuses it (a sample's None for an array).
            raise ValueError("In HybridBlock, there must be one NDArray or one Symbol in "
                             "the input. Please check the type of the args.\n")
        rec = self.rec
        before = self.state
        varying = self._varying_floats(args, key)
        if varying is not None:
            key = varying
        replay = rec.replays(block) and varying is None
        gkey = grafts.key_of(self, args, key) if replay else None
        if gkey is not None:
            graft = grafts.find(self, gkey)
            if graft is not None:
                out = grafts.apply(self, graft, args, key, before)
                if out is not None:
                    return out
        inner = before.next.get(("enter", key))
        if inner is None:
            inner = before.next[("enter", key)] = State(None, before, before.start)
        self.state = inner
        start = len(self.out_shapes)
        outer_ok, self.macro_ok = self.macro_ok, True
        outer_call = self.call_start
        if outer_call is None:
            self.call_start = start
        ext_before = len(self.ext)
        try:
            out = rec.trace(block, args)
        finally:
            ok = self.macro_ok and not self.direct and self.state.start is before.start
            self.macro_ok = outer_ok and self.macro_ok
            self.call_start = outer_call
        new_ext = len(self.ext) - ext_before
        if ok and new_ext == 0 and replay:
            arrays = flatten_args(args)[0] or ()
            outputs = self._map_out(out, start, arrays)
            if outputs is not None:
                bases = bases_made(self, out, start, arrays)
                if bases is not False:
                    before.calls[key] = Macro(self.state, tuple(self.out_shapes[start:]),
                                              tuple(self.out_dtypes[start:]), outputs, start,
                                              bases)
                    if gkey is not None:
                        grafts.remember(self, gkey, args, key, before, start)
        return out

    def _varying_floats(self, args, key):
        """The key of a child-block call whose float arguments have changed past
        ``VARYING_NUMBERS`` times at this place of the user's code, with the
        floats left out; else None.

        A constant argument is part of the key, so each new number (a sample's
        own time step given to a cell) would learn the block's calls again.
        Under the key without floats the block's code runs at every call (no
        macro replays it: the number may decide what it does), and the
        operators it calls with the number join one path
        (``_varying_number``).
        """
        if not _holds_float(args):
            return None
        plain = _without_floats(key[1])
        if not _varied(_FLOATS_SEEN, (key[0], self._place(), plain), key[1]):
            return None
        return (key[0], plain) + key[2:]

    def _place(self):
        """Where in the user's code the call being recorded was made: its
        innermost frame's code and offset (the state it starts from, else)."""
        site = sites.capture(self.caller)
        return site[-1] if site else id(self.state)

    # -- calls a pass rewrites -----------------------------------------------------
    def written(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)``, a call as written that a pass may rewrite
        (``Recorder.record``), and learn what it recorded as a :class:`Macro` under
        the call's key (``State.written``), so that a later frame on this path
        replays it without running the passes (``_core.FrameCore.call_written``).

        What a pass records depends on the call's key (its operator, constants
        and where its arrays come from: positions of this frame, whose shapes
        and bases the path fixes, outside arrays by shape) unless it reads a
        value known before the graph runs (``rec.tainted``), reads arrays
        other than the call's own from outside, cuts or falls back: then
        nothing is learned.  The call's arrays it reads from outside for the
        first time are read again by the replay, at the same positions.
        """
        rec = self.rec
        key, unread = self._written_key(op, args, kwargs)
        if key is None:
            return rec.record(op, args, kwargs)
        before = self.state
        start = len(self.out_shapes)
        ext_before = len(self.ext)
        outer_ok, self.macro_ok = self.macro_ok, True
        outer_taint, rec.tainted = rec.tainted, False
        try:
            out = rec.record(op, args, kwargs)
        finally:
            ok = self.macro_ok and not self.direct and self.state.start is before.start \
                and not rec.tainted and rec.frame is self
            self.macro_ok = outer_ok and self.macro_ok
            rec.tainted = outer_taint or rec.tainted
        if ok and len(before.written) < MAX_WRITTEN:
            reads = []
            # The outside arrays the call read first, in order (taken from the
            # end: a long loop's frame holds thousands).
            added = list(itertools.islice(reversed(self.ext.items()),
                                          max(len(self.ext) - ext_before, 0)))
            for ident, pos in reversed(added):
                k = unread.get(ident)
                if k is None:
                    return out                  # it read something else from outside
                reads.append((k, pos))
            outputs = self._map_out(out, start, args)
            bases = bases_made(self, out, start, args) if outputs is not None else False
            if bases is not False:
                before.written[key] = Macro(self.state, tuple(self.out_shapes[start:]),
                                            tuple(self.out_dtypes[start:]), outputs, start,
                                            bases, tuple(reads))
        return out

    def _written_key(self, op, args, kwargs):
        """(the key of a call as written, as ``_core.FrameCore`` builds it, its
        array arguments not read yet by position in ``args``); (None, None) when
        it cannot have one: arrays among the keywords, values with bases from
        outside the frame, weights alone, unhashable constants."""
        refs, unread = [], {}
        arrays = False
        for k, a in enumerate(args):
            if isinstance(a, NDArray):
                if type(a) is LazyArray and a._node is not self and a._base is not None:
                    return None, None
                ref = self.ref(a, read=False)
                if ref is None:
                    return None, None
                if type(ref) is tuple and ref[0] == "x":
                    if id(a) in unread:
                        # Read again (``add_n(h, h)``): not the key of two arrays read.
                        ref = ("again", unread[id(a)])
                    else:
                        unread[id(a)] = k
                arrays = arrays or type(ref) is int or ref[0] == "x"
                refs.append(ref)
            else:
                refs.append((type(a), a))
        if not arrays or kwargs and ("name" in kwargs or any(
                isinstance(v, NDArray) for v in kwargs.values())):
            return None, None
        key = (op, tuple(refs), tuple(kwargs.items())) if kwargs else (op,) + tuple(refs)
        try:
            hash(key)
        except TypeError:                   # an unhashable constant
            return None, None
        return key, unread

    def _map_out(self, obj, start, arrays):
        """The returned structure with positions for arrays; None if not describable:
        a value made before ``start`` must be an outside array, one of the call's
        ``arrays`` or one's base (what a replay finds again)."""
        if isinstance(obj, LazyArray):
            if obj._node is self:
                if obj._idx >= start or any(
                        a is obj or base_of(a) is obj for a in arrays):
                    return ("pos", obj._idx)
                return None
            pos = self.ext.get(id(obj))
            return ("pos", pos) if pos is not None and pos < start else None
        if isinstance(obj, (list, tuple)):
            inner = [self._map_out(o, start, arrays) for o in obj]
            if any(i is None for i in inner):
                return None
            return (type(obj), inner)
        if isinstance(obj, (int, float, str, bool, type(None))):
            return ("v", obj)
        return None

    # -- ending -----------------------------------------------------------------
    def cut(self, why):
        """Put what the frame recorded so far into the graph; go on in a new segment."""
        if self.direct:
            return
        positions = self._emit(self.scan())
        nxt = self.state.cuts.get(positions)
        if nxt is None:
            nxt = self.state.cuts[positions] = State(None, self.state, None, self.state.counter)
        self.state = nxt
        self.macro_ok = False

    def _emit(self, alive):
        """Put the current segment into the graph, exporting ``alive`` (in order of
        position, so that frames that made their values in another order, a
        child block replayed instead of traced, share the recipe); their positions.
        """
        positions = tuple([lazy._idx for lazy in alive])
        if not alive:
            return positions
        recipe = self.state.recipes.get(positions)
        if recipe is None:
            recipe = self.state.recipes[positions] = self.rec.recipe_for(self, positions)
        apply_recipe(self, alive, recipe)
        return positions

    def fallback(self, why):
        """Cut, then record the rest of this call one node per operator."""
        if self.direct:
            return
        self.cut(why)
        self.direct = True
        if self.rec.frame is self:
            self.rec.frame = None

    def fallback_op(self, op, args, kwargs, why):
        """``op`` recorded directly in the graph, after a fallback."""
        self.fallback(why)
        return self.rec.call_op(op, args, kwargs)

    def read(self):
        """A provisional value is read: cut, then run what is pending."""
        self.cut("a value is read")
        self.rec.read()


def one_call(rec, function, *args):
    """``function(*args)``, its operators recorded as parts of one call of the
    frame recording now: ``sites.py`` then sees one call at the user's line,
    not a loop going round (several calls at one offset).  Passes that record
    a call as several (``gluon_dynbatch.rewrite``) run through it."""
    frame = rec.frame
    if frame is None or frame.call_start is not None:
        return function(*args)
    frame.call_start = len(frame.out_shapes)
    try:
        return function(*args)
    finally:
        frame.call_start = None
