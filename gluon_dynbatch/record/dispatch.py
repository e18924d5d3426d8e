"""Dispatch: how each block call is recorded inside a scope.

While any scope is open, ``Block.__call__`` is replaced (``attach_call``)
by a dispatcher that decides, per block class, how a call is recorded:

* a ``DynBatchBlock`` (a class with ``records_frames``) starts a *frame*
  around its ``hybrid_forward`` (``record_call``);
* a *traced* block (a ``HybridBlock`` whose ``forward`` only wraps
  ``hybrid_forward``: layers, containers, hybridized blocks, Gluon's
  recurrent cells) runs its ``hybrid_forward`` with the recording ``F``, as
  part of the frame recording now;
* an *opaque* block (an overridden ``forward``, a ``SymbolBlock``, a cell that
  keeps state between calls, a block with hooks) runs on concrete values,
  which first runs what is pending;
* a plain ``Block`` runs as it is.

Gluon's recurrent cells and fused RNN layers make their zero states with
``mx.nd.zeros`` at every call; inside a model's call they get the recording
``F.zeros`` instead (one constant per graph).  A fused layer called without
states records its ``F.RNN`` without state outputs, so calls of every length
share one padded call (``rules.layers.PaddedRNNRule``).
"""
import collections
import dis
import functools
import logging
import sys
import types
import weakref

import greenlet
import mxnet as mx
from mxnet import gluon
from mxnet.ndarray import NDArray

from . import _core
from . import context
from . import trie
from .trie import holds_array
from .frames import NOT_RECORDED, Frame
from .lazy import LazyArray
from .tasks import settings_of
from .recursion import (raise_limit, recursion_note, restore_limit, stop_watching,
                        watch_closures)
from ..errors import BatchingError, describe_call
from ..logs import warn_once

log = logging.getLogger("gluon_dynbatch.record")


def record_call(self, rec, args):
    """Record a top-level call of DynBatchBlock ``self`` inside a scope: a sample,
    recorded as a frame (``_core.record_frame``, which records the calls below it),
    run as a task (``tasks.py``) unless one is running already.  A hybridized
    parent tracing its graph passes Symbols: traced as a HybridBlock is."""
    if any(isinstance(a, mx.sym.Symbol) for a in args):
        return self.forward(*args)
    if rec.eager:
        return eager_call(self, rec, args)
    if rec.tasks.current is None:
        return rec.tasks.call(_record_sample, (self, rec, args), self, settings_of(args, self),
                              sys._getframe(1))  # pylint: disable=protected-access
    return _record_sample(self, rec, args)


# MXNet raises an error of a call that ran asynchronously where a value is next read.
_ASYNC = ("; MXNet raises an error of a batched call where a value is next read, so the "
          "call at fault may be another sample's")


def _record_sample(self, rec, args):
    rec.sample = rec.num_samples
    rec.num_samples += 1
    rec.blocks_called[id(self)] = self
    if getattr(rec, "strategy", None) is None:
        rec.strategy = self.strategy
        rec.compiled = self.compiled
        rec.cache = self.plan_cache
        rec.owner = self
        if self.max_pending_nodes is not None and rec.scope is not None \
                and rec.scope.max_pending_nodes is None:
            rec.max_pending = self.max_pending_nodes
    raise_limit()
    try:
        return _core.record_frame(self, rec, rec.wrap_arguments(args))
    except BatchingError:
        raise
    except BaseException as err:
        # (What stops a program or a task, not an error of the sample, goes unnoted.)
        if hasattr(err, "add_note") and not isinstance(err, _NOT_ERRORS):
            where = describe_call(rec.sample, rec.path + (self._name,))
            err.add_note(recursion_note(where) if isinstance(err, RecursionError)
                         else "gluon_dynbatch: raised while recording %s%s" % (
                             where, _ASYNC if isinstance(err, mx.base.MXNetError) else ""))
        raise
    finally:
        restore_limit()
        rec.sample = None


_NOT_ERRORS = (KeyboardInterrupt, SystemExit, GeneratorExit, greenlet.GreenletExit)


def tell_irregular(block, root):
    """Count a call of a block recorded operator by operator, and say once per
    block that its calls are (``usage.py``)."""
    root.usage.op_calls += 1
    if not root.usage.told:
        root.usage.told = True
        log.info("%s: calls take a new path through the code almost every time (a "
                 "structure of each sample's own); recording them operator by operator",
                 type(block).__name__)


def record_helper(self, rec, function, args, kwargs):
    """One call of a recursive helper method or closure inside a frame: a frame
    of its own, as ``self(...)`` would be (see ``recursion.py``)."""
    root = rec.frame_root(self, function.__code__)
    outer_path, outer_frame = rec.path, rec.frame
    rec.path = outer_path + (function.__name__,)
    frame = None if root.usage.irregular else Frame(rec, root, self, rec.path)
    if frame is None:
        root.usage.op_calls += 1
    rec.frame = frame
    try:
        out = function(*args, **kwargs)
        if frame is not None:
            frame.finish()              # ``out`` holds what the call returns
        return out
    finally:
        rec.frame = outer_frame
        rec.path = outer_path


def eager_call(self, rec, args):
    """One sample run eagerly inside a scope that stopped recording (see
    ``BatchingScope.read``)."""
    stats = rec.scope.stats
    # Samples run on from those recorded, as errors number them.
    sample = rec.num_samples + stats.eager_samples
    stats.samples += 1
    stats.eager_samples += 1
    context.set_current(None)
    try:
        return _ORIGINAL_CALL(self, *args)
    except Exception as err:
        if hasattr(err, "add_note"):
            err.add_note("gluon_dynbatch: raised while running eagerly (the scope stopped "
                         "recording after reads in its own code): %s"
                         % describe_call(sample, rec.path + (self._name,)))
        raise
    finally:
        context.set_current(rec)


def _has_lazy(args):
    for a in args:
        if isinstance(a, LazyArray):
            return True
        if isinstance(a, (list, tuple)) and _has_lazy(a):
            return True
    return False


_KINDS = {}     # block class -> how its calls are recorded (asked on every call)
_KIND_OF = {}   # block class -> the ``hybrid_forward`` its kind was found for


_DYNBATCH, _TRACED, _CELL, _OPAQUE, _PLAIN = "dynbatch", "traced", "cell", "opaque", "plain"


# ``forward`` methods that only wrap ``hybrid_forward``: HybridBlock's own,
# and Gluon's recurrent cells' (which count their calls first).
_WRAPPERS = {gluon.HybridBlock.forward: _TRACED,
             gluon.rnn.rnn_cell.RecurrentCell.forward: _CELL}


# Cells whose ``hybrid_forward`` keeps state in the block between calls
# (ZoneoutCell remembers its previous output, VariationalDropoutCell its masks
# until ``reset()``): run on concrete values.
STATEFUL_CELLS = (gluon.rnn.ZoneoutCell, gluon.contrib.rnn.VariationalDropoutCell)


def _kind(cls):
    """How calls of blocks of class ``cls`` are recorded inside a scope.

    DynBatchBlocks start frames.  A HybridBlock whose ``forward`` merely
    wraps ``hybrid_forward`` (HybridBlock's own: layers, containers,
    hybridized blocks; or a Gluon recurrent cell's) is traced: its
    ``hybrid_forward`` runs with the recording ``F``.  Other HybridBlocks
    (an overridden ``forward``, ``SymbolBlock``, the cells of
    ``STATEFUL_CELLS``) are opaque: they run on concrete values.  Plain
    Blocks run as they are.
    """
    found = _KINDS.get(cls)
    if found is None:
        if getattr(cls, "records_frames", False):      # a DynBatchBlock
            found = _DYNBATCH
        elif issubclass(cls, gluon.HybridBlock):
            found = _WRAPPERS.get(cls.forward, _OPAQUE)
            if cls.hybrid_forward is gluon.HybridBlock.hybrid_forward \
                    or issubclass(cls, STATEFUL_CELLS) \
                    or _tests_identity_of_F(cls.hybrid_forward) \
                    or any(asks_namespace(f) for f in own_functions(cls)):
                found = _OPAQUE     # (its helpers, one call deep, asked too)
        else:
            found = _PLAIN
        _KINDS[cls] = found
        _KIND_OF[cls] = getattr(cls, "hybrid_forward", None)
    return found


def forget_replaced():
    """Forget the kinds of classes whose ``hybrid_forward`` was replaced since
    they were found (a notebook cell assigning ``Cls.hybrid_forward``): a
    scope's first call of them finds their kind again."""
    for cls, function in list(_KIND_OF.items()):
        if getattr(cls, "hybrid_forward", None) is not function:
            _KINDS.pop(cls, None)
            del _KIND_OF[cls]


def _tests_identity_of_F(function):
    """Whether ``function`` (a ``hybrid_forward``) asks whether its ``F`` is some
    namespace (``if F is mx.nd:``): it would take its symbolic branch on the
    recording ``F``, so its block runs on concrete values, with ``mx.nd``.

    Gluon's own blocks ask so only in numpy-array mode, or are recorded by
    code of this package (``_layer_hybrid_forward``): they are not asked.
    """
    code = getattr(function, "__code__", None)
    if code is None or code.co_argcount < 2 \
            or (getattr(function, "__module__", None) or "").startswith(
                ("mxnet.", "gluon_dynbatch.")):
        return False
    name = code.co_varnames[1]
    return any(head.opname == "LOAD_FAST" and head.argval == name and not attrs
               for head, attrs in _identity_operands(code))


def _identity_operands(code):
    """``(first instruction, attribute names)`` of each operand of each ``is``
    (or ``is not``) comparison in ``code``: ``F``, ``mx.nd``..."""
    instructions = list(dis.get_instructions(code))
    for k, ins in enumerate(instructions):
        if ins.opname != "IS_OP":
            continue
        end = k
        for _ in range(2):              # the right operand, then the left one
            j = end - 1
            while j > 0 and instructions[j].opname == "LOAD_ATTR":
                j -= 1
            if j < 0:
                break
            yield instructions[j], [i.argval for i in instructions[j + 1:end]]
            end = j


def own_functions(cls):
    """The functions of ``cls``'s own code (not Gluon's or this package's)."""
    for klass in cls.__mro__:
        if (klass.__module__ or "").startswith(_LIBRARIES):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if getattr(value, "__code__", None) is not None:
                yield value


_LIBRARIES = ("mxnet.", "gluon_dynbatch.")
_NAMESPACES = frozenset(["nd", "sym", "ndarray", "symbol"])
_NAMESPACE_MODULES = (mx.nd, mx.sym)      # (``mx.ndarray``, ``mx.symbol``: the same)
_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF")
# function -> whether it asks ``... is mx.nd`` (``asks_namespace``); weak: a
# block's own ``hybrid_forward`` set on it is a bound method of the block.
_ASKS = weakref.WeakKeyDictionary()
MAX_CALL_DEPTH = 4
"""How deep ``asks_namespace`` follows the functions a function calls."""


def asks_namespace(function):
    """Whether ``function``, a function it defines (closures, lambdas) or a
    function it calls by a name of its module (``helper(F, x)``,
    ``helpers.pool(F, x)``; up to ``MAX_CALL_DEPTH`` calls deep) compares
    something with MXNet's namespaces by identity (``if F is mx.nd:``, ``F is
    nd``, ``mx.sym is F``, an alias ``F is mnd``): given the recording ``F`` it
    would take the symbolic branch.  Wrapped functions are read through their
    ``__wrapped__`` (the recursive helpers of ``recursion.py``)."""
    function = plain_function(function)
    try:
        found = _ASKS.get(function)
    except TypeError:               # (not weakly referable)
        return _asks(function, MAX_CALL_DEPTH, set())
    if found is None:
        found = _ASKS[function] = _asks(function, MAX_CALL_DEPTH, set())
    return found


def plain_function(function):
    """The function that runs when ``function`` is called: through bound methods,
    ``functools.partial`` and wrappers (``__wrapped__``)."""
    for _ in range(MAX_CALL_DEPTH * 4):
        if isinstance(function, types.MethodType):
            function = function.__func__
        elif isinstance(function, functools.partial):
            function = function.func
        elif hasattr(function, "__wrapped__"):
            function = function.__wrapped__
        else:
            break
    return function


def _asks(function, depth, seen):
    """``asks_namespace`` of a plain function, following calls ``depth`` deep."""
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _names_of(function)
    for inner in _codes(code):
        operands = list(_identity_operands(inner))
        if any(_namespace(head, attrs, names) for head, attrs in operands):
            return True
        if depth > 0 and any(_asks(called, depth - 1, seen)
                             for called in _called_functions(inner, names)):
            return True
    return False


def _names_of(function):
    """What the names ``function``'s code loads stand for: its module's globals
    and the contents of its closure's cells."""
    cells = {}
    for name, cell in zip(function.__code__.co_freevars,
                          getattr(function, "__closure__", None) or ()):
        try:
            cells[name] = cell.cell_contents
        except ValueError:          # an empty cell (defined later)
            pass
    return collections.ChainMap(cells, getattr(function, "__globals__", None) or {})


def _codes(code):
    """``code`` and the code objects defined in it (closures, lambdas)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _resolved(head, attrs, names):
    """The object an instruction loading a name, then ``attrs``, stands for, or None."""
    if head.opname not in _NAME_LOADS:
        return None
    value = names.get(head.argval)
    for attr in attrs:
        if value is None:
            return None
        value = getattr(value, attr, None)
    return value


def _namespace(head, attrs, names):
    """Whether an operand of ``is`` is one of MXNet's namespaces, by its name
    (``mx.nd``, ``nd``) or by what it stands for (an alias)."""
    if head.opname in _NAME_LOADS and (
            attrs and attrs[-1] in _NAMESPACES and head.argval in ("mx", "mxnet")
            or not attrs and head.argval in _NAMESPACES):
        return True
    value = _resolved(head, attrs, names)
    return value is not None and any(value is module for module in _NAMESPACE_MODULES)


def _called_functions(code, names):
    """The Python functions of user code that names in ``code`` stand for
    (``helper``, ``helpers.pool``): a loaded name and the attributes after it."""
    instructions = list(dis.get_instructions(code))
    for k, ins in enumerate(instructions):
        if ins.opname not in _NAME_LOADS:
            continue
        attrs, j = [], k + 1
        while j < len(instructions) and instructions[j].opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attrs.append(instructions[j].argval)
            j += 1
        value = plain_function(_resolved(ins, attrs, names))
        if isinstance(value, types.FunctionType) \
                and not (value.__module__ or "").startswith(_LIBRARIES):
            yield value


_ORIGINAL_CALL = gluon.Block.__call__


def dispatch(self, rec, kind, args):
    """A call of a block other than a DynBatchBlock inside a scope (see the module
    docstring); ``kind`` is how its class is recorded (``_kind``)."""
    if kind is _CELL:
        self._counter += 1          # as RecurrentCell.forward counts its calls
        kind = _TRACED
    elif kind == _TRACED and rec.frame is not None and not (
            self._forward_pre_hooks or self._forward_hooks):
        # ``_core.dispatching_call`` asked the frame already (and counted a cell's call).
        rec.frame.fallback("a child block that templates cannot hold")
    hooked = kind is not _PLAIN and (self._forward_pre_hooks or self._forward_hooks)
    frame = rec.frame
    if frame is not None and kind is not _PLAIN:
        if kind is _TRACED and not hooked:
            out = frame.block_call(self, args)
            if out is not NOT_RECORDED:
                return out
        frame.fallback("a child block that templates cannot hold")
    if kind is _TRACED and (_has_lazy(args) or rec.depth > 0 and holds_array(args)):
        # In a model's call, a block on concrete arrays alone (an embedding of a
        # sample's token ids) is recorded too: one batched call, not one launch
        # a call, and views of its result instead of arrays sliced eagerly.
        if rec.frames_on() and not hooked:
            return rec.block_frame(self, args)
        return rec.trace(self, args)
    if kind is _OPAQUE and isinstance(self, STATEFUL_CELLS):
        rec.tasks.keep_cells(self)      # (a cell held outside the model's children)
    if kind is _OPAQUE and _has_lazy(args):
        # Opaque block (SymbolBlock, custom forward): run it on concrete values.
        # A read inside it is said to be this call's (``scope._read_place``).
        outer = rec.black_box
        if outer is None:
            rec.black_box = (self, sys._getframe(1))  # pylint: disable=protected-access
        try:
            return rec.wrap_inputs(_ORIGINAL_CALL(self, *args))
        finally:
            rec.black_box = outer
    return _ORIGINAL_CALL(self, *args)


_ORIGINAL_BEGIN_STATE = gluon.rnn.RecurrentCell.begin_state


def _begin_state(self, batch_size=0, func=mx.nd.zeros, **kwargs):
    """``RecurrentCell.begin_state`` whose zeros, inside a DynBatchBlock call, are
    recorded ``F.zeros``: one constant per graph that every sample shares.

    Gluon's default, ``mx.nd.zeros``, makes new arrays at every call (tens of
    microseconds each, once per sentence or tree node).  Outside a model's
    call, or with another ``func`` given, it is Gluon's own.
    """
    if func is mx.nd.zeros:
        rec = context.TLS.recorder
        if rec is not None and not rec.eager and rec.depth > 0:
            func = rec.F.zeros
    return _ORIGINAL_BEGIN_STATE(self, batch_size, func=func, **kwargs)


_ORIGINAL_LAYER_BEGIN_STATE = gluon.rnn.rnn_layer._RNNLayer.begin_state


def _layer_begin_state(self, batch_size=0, func=mx.nd.zeros, **kwargs):
    """The same for Gluon's fused RNN layers (``rnn.LSTM``, ``GRU``, ``RNN``),
    which make their zeros with ``mx.nd.zeros`` when called without states."""
    if func is mx.nd.zeros:
        rec = context.TLS.recorder
        if rec is not None and not rec.eager and rec.depth > 0:
            func = rec.F.zeros
    return _ORIGINAL_LAYER_BEGIN_STATE(self, batch_size, func=func, **kwargs)


_ORIGINAL_LAYER_FORWARD = gluon.rnn.rnn_layer._RNNLayer.hybrid_forward


class _OutputsOnly:
    """The recording ``F`` for a fused RNN layer called without states: its
    ``F.RNN`` makes no state outputs, which the layer would drop anyway, so
    that calls on sentences of different lengths can share one padded call
    (``layer_rules.PaddedRNNRule``)."""

    def __init__(self, F):
        self._F = F

    def __getattr__(self, name):
        return getattr(self._F, name)

    def RNN(self, *args, **kwargs):  # pylint: disable=invalid-name
        """``F.RNN`` with ``state_outputs=False``; the layer reads [outputs, states...]."""
        kwargs["state_outputs"] = False
        return [self._F.RNN(*args, **kwargs), None, None]


class _LastStepState(_OutputsOnly):
    """The recording ``F`` for a one-layer fused RNN layer given states: its
    outputs come from a call without state outputs (one padded call for
    sentences of every length) and its final hidden state is their last step
    (and, bidirectional, the backward half of their first), the same values;
    the call with state outputs (a call per length) stays for the other states
    (an LSTM's cell state), computed only if held."""

    def RNN(self, *args, **kwargs):  # pylint: disable=invalid-name
        full = self._F.RNN(*args, **kwargs)
        outputs = super().RNN(*args, **kwargs)[0]
        steps, F = args[0].shape[0], self._F
        last = F.slice_axis(outputs, axis=0, begin=steps - 1, end=steps)
        if kwargs.get("bidirectional"):
            hidden = outputs.shape[2] // 2
            first = F.slice_axis(outputs, axis=0, begin=0, end=1)
            last = F.concat(F.slice_axis(last, axis=2, begin=0, end=hidden),
                            F.slice_axis(first, axis=2, begin=hidden, end=2 * hidden), dim=0)
        return [outputs, last] + list(full[2:])


def _layer_hybrid_forward(self, F, inputs, states, sequence_length=None, **kwargs):
    rec = context.TLS.recorder
    if rec is not None and F is rec.F and not rec.faithful():
        if self.skip_states and self._projection_size is None:
            # (MXNet 1.9.1's RNN with a projection aborts the process without
            # state outputs: such a layer runs as its code is written.)
            F = _OutputsOnly(F)
        elif self._num_layers == 1 and not self._dropout \
                and self._projection_size is None and sequence_length is None:
            F = _LastStepState(F)
    return _ORIGINAL_LAYER_FORWARD(self, F, inputs, states, sequence_length, **kwargs)


_ORIGINAL_SETATTR = gluon.Block.__setattr__
_MISSING = object()


def _watching_setattr(self, name, value):
    """``Block.__setattr__`` inside a scope.

    A block's setting (``trie.settings``) changed (``self.cell.mode = k`` per
    sample), a child block put in another's place (``model.cell.act = relu``), or
    an attribute that was None given a value makes the scope's block tokens
    anew, so that no call replays what the block recorded before.  Set by the
    scope's own code while samples wait at reads, it waits for them to finish
    first, as eager code finished them before; set by a sample that changed
    autograd's modes, the sample waits for its round first."""
    rec = context.TLS.recorder
    if rec is not None:
        tasks = rec.tasks
        if tasks.current is not None and rec._mode_seen != context.MODE_CHANGES[0] \
                and not tasks.restoring and not rec.flushing and not trie.is_bookkeeping(name):
            # A sample that changed autograd's modes waits at its next call
            # (``Recorder.sync_mode``): before this write (of the same value
            # too), so that the other samples' writes meanwhile do not reach
            # its call.
            rec.sync_mode()
        old = self.__dict__.get(name, _MISSING)
        if old is not value:
            if tasks.current is None and tasks.waiting and not tasks.restoring \
                    and not rec.flushing and not trie.is_bookkeeping(name):
                warn_once("block set while waiting", "%s.%s is set by the scope's code while "
                          "samples wait at a read; they finish first, with its old value, as "
                          "in eager code (give per-sample values as arguments, or set it "
                          "before the loop, to batch those samples with the next ones)"
                          % (type(self).__name__, name))
                tasks.drain()
            # Compared only with an old setting: ``!=`` of an array (a state a
            # block keeps between calls, reset to None) is elementwise, or raises.
            if trie.is_setting(name, value) and not (trie.is_setting(name, old) and old == value) \
                    or old is None and trie.is_setting(name, old) \
                    or isinstance(value, gluon.Block) or isinstance(old, gluon.Block):
                rec.forget_tokens()
    _ORIGINAL_SETATTR(self, name, value)


def note_inputs(block, args):
    """Note the shapes and dtypes of a hybridized child's inputs, the first time
    it is recorded (``Recorder.trace``) without a graph of its own: Gluon builds
    that graph at its first eager call, and ``export`` needs it."""
    if getattr(block, "_active", False) and not block._cached_graph \
            and getattr(block, "_gdb_inputs", None) is None:
        # (not ``Block.__setattr__``: no setting a template depends on)
        object.__setattr__(block, "_gdb_inputs", _input_specs(args))


def _input_specs(value):
    if isinstance(value, NDArray):
        return ("array", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_input_specs(v) for v in value)
    return value


def _placeholders(spec):
    if type(spec) is tuple and len(spec) == 3 and spec[0] == "array":
        return mx.nd.zeros(spec[1], dtype=spec[2])
    if isinstance(spec, (list, tuple)):
        return type(spec)(_placeholders(v) for v in spec)
    return spec


_ORIGINAL_EXPORT = gluon.HybridBlock.export


def _export(self, path, epoch=0, remove_amp_cast=True):
    """``HybridBlock.export`` of a hybridized child recorded only in scopes:
    its graph is built first from the inputs noted (``note_inputs``), as
    Gluon builds it at a first eager call."""
    spec = getattr(self, "_gdb_inputs", None)
    if not self._cached_graph and spec is not None:
        self._build_cache(*_placeholders(spec))     # its graph and CachedOp, not run
    return _ORIGINAL_EXPORT(self, path, epoch, remove_amp_cast)


def install():
    """Replace ``Block.__setattr__``, ``HybridBlock.export``, and Gluon's RNN
    begin states and layer calls (``Block.__call__`` while a scope is open:
    ``attach_call``)."""
    gluon.Block.__setattr__ = _watching_setattr
    gluon.HybridBlock.export = _export
    gluon.rnn.RecurrentCell.begin_state = _begin_state
    gluon.rnn.rnn_layer._RNNLayer.begin_state = _layer_begin_state
    gluon.rnn.rnn_layer._RNNLayer.hybrid_forward = _layer_hybrid_forward


def attach_call():
    """Record block calls: ``Block.__call__`` while any scope is open."""
    gluon.Block.__call__ = _core.dispatching_call


def detach_call():
    """Gluon's own ``Block.__call__`` once no scope is open: outside scopes the
    replacement would only call it, a level deeper in every recursion (a deep
    tree run eagerly would reach the recursion limit sooner)."""
    gluon.Block.__call__ = _ORIGINAL_CALL


_core.bind_dispatch(context.TLS, _KINDS, _kind, _ORIGINAL_CALL, dispatch, record_call, Frame,
                    tell_irregular, watch_closures, stop_watching, NOT_RECORDED,
                    {kind: forward for forward, kind in _WRAPPERS.items()}, asks_namespace)
