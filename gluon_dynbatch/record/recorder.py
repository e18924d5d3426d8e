"""The recorder: calls on lazy values become nodes of the graph.

One recorder serves one batching scope on one thread (reached through
``context.current()``).  Inside a DynBatchBlock call (a frame, ``frames.py``)
operator and child-block calls go to the frame; the frame puts its calls into
the graph when it ends.  Everything else is recorded here, a node per call:

* leaves: input arrays, parameters, constants (``F.zeros``, one per graph);
* views: row slices (``x[i:j]``) and row concatenations of graph values,
  which cost no step (their consumers gather the rows);
* operator calls outside frames (the scope's own code, a frame that fell
  back), analysed once per call shape (``calls.py``).

A child block called outside any frame is recorded as a frame of its own
(``block_frame``), so it too becomes one program node.
"""
import weakref

import mxnet as mx
from mxnet import gluon
import numpy as np
from mxnet.ndarray import NDArray
from mxnet.ndarray.sparse import BaseSparseNDArray

from ..ir import _scan, calls
from . import aliases
from . import context
from . import dispatch
from . import passes
from . import purity
from . import trie
from . import weights as weight_calls
from ..errors import BatchingError, describe_call
from ..logs import warn_once
from . import _core
from ._core import Operator, RecorderCore, typed_attributes
from .alone import run_alone
from .frames import NOT_RECORDED, Frame
from ..ir.graph import (LEAF, NO_KWARGS, OP, VIEW, Graph, Node, analysed_node, slot,
                    slots_of)
from .lazy import LazyArray
from .namespace import DETERMINISTIC, RecordingNamespace, forget
from .tasks import Pending, Tasks
from ..ir.ops import opdef, positional

_IDENTITY = opdef("identity")
_RUNS_ITS_CODE = "runs its code"    # in the token of a block whose calls are not replayed

DEFAULT_MAX_PENDING = 500000    # pending nodes after which a scope flushes by itself
MAX_ROW_CONCAT = 4096           # longer row concatenations take the generic path
_SLICE_AXIS = opdef("slice_axis")
_RESHAPE = opdef("reshape")
_ONE_SLOT = (slot(0),)
_core.bind_nodes(Node, NO_KWARGS, opdef("concat"), calls.INFOS, slot, slots_of,
                 MAX_ROW_CONCAT)
_scan.bind(Node, LazyArray)
_ROW_SLICES = {}    # (begin, end, trailing shape, dtype) -> (CallInfo, kwargs) of a row-slice view
_ROW_WIDTHS = {}    # (end - begin, trailing shape, dtype) -> a CallInfo of such a view
MAX_ROW_WIDTHS = 100000


def _never_computed():
    """The error of a value read after its scope ended without computing it."""
    return BatchingError(
        "this value was recorded in a batching scope that has ended without computing "
        "it: its sample raised (its calls were dropped with it), or the scope failed; "
        "record it again in a new scope")


_PARAMETER_DATA = gluon.Parameter.data


def _warn_data_read_once(parameter):
    """Say that ``parameter``'s own ``data()`` (gluonnlp's ``WeightDropParameter``
    draws a dropout mask in it) is read once a flush, not once a call."""
    warn_once(("own data", type(parameter)),
              "parameter %s is a %s, whose data() is its own: inside a scope it is read "
              "once a flush, so the samples of a flush share its value (a weight-drop mask "
              "is shared as in a batched model), where eager reads it at every call",
              parameter.name, type(parameter).__name__)


class Recorder(RecorderCore):
    """Records the calls of one batching scope on this thread."""

    def __init__(self, flush, ctx=None, read=None, recipe_for=None):
        self._flush = flush
        self._param_tables = {}     # id(owner) -> (owner, its parameters' arrays): ``leaf``
        # How a frame's calls go into the graph (``templates.recipe_for``).
        self.recipe_for = recipe_for
        self._read = read or flush
        self.ctx = ctx
        self.graph = Graph(ctx, flush, self._read)
        self.tasks = Tasks(self, flush)    # samples as resumable tasks (``tasks.py``)
        self.entered = None     # the frames entering the scope (``handlers.entry_frames``)
        self.rows_token = object()  # marks values this scope's flushes handed out (``leaf``)
        self.F = RecordingNamespace(self)
        self.scope = None
        self.sample = None          # index of the current top-level call
        self.num_samples = 0        # top-level calls in this scope (sample numbers)
        self.samples_flushed = 0    # of which counted by earlier flushes
        self.path = ()              # block names being recorded, for messages
        self.depth = 0              # nesting of DynBatchBlock calls
        self.num_recorded = 0       # nodes made since the last flush
        self.num_calls = 0          # operator calls recorded (in frames or not)
        self.max_pending = DEFAULT_MAX_PENDING
        self.row_views = _ROW_SLICES    # row views whose analysis is known (``row_slice``)
        self.replay = True          # child blocks replayed from their first trace
        self.owner = None           # the first top-level DynBatchBlock called
        self.blocks_called = {}     # id -> every top-level DynBatchBlock called
        self._called_params = (0, [])   # (blocks, their parameters): ``_called_parameters``
        self.last_stateful = None   # last stateful node recorded (calls.STATEFUL)
        self.frame = None           # the Frame recording now, if any
        self.innermost = None       # the innermost Frame open, fallen back or not
        self.snapshots = {}         # id -> (a variable's handle a sample attached, its array)
        self.frames = None          # whether calls are recorded as frames (frames_on)
        self._faithful = None       # whether no pass rewrites calls (``faithful``)
        self.tainted = False        # a pass read known values (``Frame.written``)
        self.lazy_pool = []         # dead provisional LazyArrays, reused by frames
        self.eager = False          # reads flush every sample: run the rest eagerly
        self.flushing = False       # a flush runs (``scope.flush``)
        self.numpy_semantics = mx.util.is_np_array()
        if self.numpy_semantics:
            warn_once("numpy semantics", "numpy semantics are on (npx.set_np()): the "
                      "blocks' calls run as eagerly, one sample at a time, not batched "
                      "(mx.np operators take mx.np arrays only)")
        self.black_box = None       # (opaque block, caller's frame) of the call running
        self.mode = None            # autograd's (recording, training) of new calls
        self._mode_seen = None      # MODE_CHANGES[0] when self.mode was read
        self._versions = {}         # id(block) -> parameter identity, per scope
        self._tokens = {}           # id(block) -> block_token, per scope
        self._guarded = {}          # id(block) -> (token, purity guards), per scope
        self._unreplayable = set()  # ids of blocks whose code runs at every call
        self._identities = {}       # id(block) -> (block, block_identity), per scope
        self._roots = {}            # (id(block), modes) -> frame_root, per scope
        self._store = trie.store()
        # id(array) -> (array, shape, dtype) of plain arrays made leaves of this
        # graph and of the one before (``_described``).
        self._described = ({}, {})
        # id(array) -> (array, task) of the sample that last wrote an array from
        # outside the scope (``_written_by_earlier``).
        self._outside_writers = {}
        # id(view) -> (it, base, begin, end): views of rows of plain arrays made
        # in samples (``aliases.outside_rows``)
        self.outside_rows = {}

    @property
    def constant_ids(self):
        """id -> array of the constants this thread reuses (``make_constant``)."""
        return self._store.constant_ids

    # -- autograd's modes -----------------------------------------------------------
    def sync_mode(self):
        """Re-read autograd's modes if they may have changed; return them.

        Calls recorded under other modes than the pending ones cannot run in
        the same batch: the pending calls run first.  The scope's own code
        runs them now (a flush); a sample's task waits for the next round, as
        at a read, so that the other samples' calls in the pending modes
        batch with its own (a search under ``autograd.pause()`` in each of
        them: one round per change of modes, not a flush per sample).
        """
        if self._mode_seen == context.MODE_CHANGES[0]:
            return self.mode
        self._mode_seen = context.MODE_CHANGES[0]
        mode = context.autograd_mode()
        if mode != self.mode:
            frame = self.frame
            if frame is not None:       # its calls so far enter the graph under the old modes
                frame.fallback("autograd's mode changed")
            outer = self.innermost
            while outer is not None:
                # And those of the calls around it: a value of theirs read under
                # the new modes would enter the graph then, under those.
                outer.cut("autograd's mode changed")
                outer = outer.parent
            self.mode = mode
        pending = self.graph.mode
        task = self.tasks.current
        if task is None or task.done:       # the scope's code, or a finished task's
            if pending is not None and pending != mode:     # results handed to its
                self._flush()                               # placeholders
        elif self._round_modes() not in (None, mode):   # (another task may have left them)
            self._wait_for_modes(mode)
        return mode

    def _round_modes(self):
        """The modes a task's calls must run under now: those of the pending calls,
        or, with nothing pending, those of the tasks the round resumes."""
        pending = self.graph.mode
        return self.tasks.mode if pending is None else pending

    def _wait_for_modes(self, mode):
        """The running task waits until the pending calls' modes are its own
        (or nothing is pending); the other tasks may change them meanwhile."""
        while self._round_modes() not in (None, mode):
            self.tasks.wait()
        self._mode_seen = context.MODE_CHANGES[0]
        self.mode = mode

    def same_mode(self):
        """Whether autograd's modes are still those of the pending calls; MXNet sets
        them too (deferred initialisation pauses recording), often back as they were."""
        before = self.mode
        return self.sync_mode() == before

    def close(self):
        """Drop references back to the scope (closures of F refer to the recorder).

        A closure or generator of a sample's code that outlives the scope
        keeps its ``F``: its calls from then on go to the scope open when they
        are made, or run eagerly (``call_after_close``, ``namespace.forget``).
        """
        self.graph.release()
        self.lazy_pool = []
        self._described = ({}, {})
        self._outside_writers = {}
        self.outside_rows = {}
        self.closed = True
        if self.F is not None:
            forget(self.F)
        self.F = self._flush = self._read = self.scope = None
        self.tasks.rec = self.tasks._flush = None  # pylint: disable=protected-access

    @staticmethod
    def call_after_close(op, name, args, kwargs):
        """``F.<op>(...)`` of a scope that has ended: recorded in the scope open
        now, if any, else run as ``mx.nd`` runs it."""
        current = context.current()
        if current is None:
            return op.nd_fn(*args, **kwargs)
        return Operator(current, op, name, passes.applies(op.name))(*args, **kwargs)

    def flush(self):
        """Run everything pending now."""
        if self._flush is None:
            raise _never_computed()
        self._flush()

    def read(self):
        """Run everything pending now: a value is read (``scope.read``)."""
        if self._read is None:
            raise _never_computed()
        self._read()

    # -- values -----------------------------------------------------------------------
    def new_graph(self):
        """Start a fresh graph (after a flush or a failure)."""
        self.graph = Graph(self.ctx, self._flush, self._read)
        self._described = ({}, self._described[0])

    def _set_ctx(self, ctx):
        if self.ctx is None:
            self.ctx = self.graph.ctx = ctx
        elif ctx is not self.ctx and ctx != self.ctx:
            raise BatchingError(
                "%s: arrays on different contexts (%s and %s); a scope batches on one "
                "context: samples on several contexts (split_and_load) take a scope "
                "each" % (describe_call(self.sample, self.path), self.ctx, ctx))

    def new_leaf(self, array):
        """The LazyArray standing for concrete ``array`` in this graph, neither found
        in it nor rows a flush of this scope handed out (``RecorderCore.leaf``)."""
        graph = self.graph
        found = self.param_table().get(id(array))
        if found is not None and found[0] is array:     # ``p.data()`` read in the model
            return self.param(found[1])                 # ``p`` itself, shared by every call
        if self.outside_rows and self.depth > 0:
            found = aliases.outside_rows(self, array)
            if found is not None:
                lazy = self._rows_leaf_of(array, *found)
                if lazy is not None:
                    return lazy
        described = self._described_leaf(array)
        node = graph.add(Node(graph, LEAF))
        node.value = array
        # ``x.attach_grad()``: see ``context._variables`` (read as MXNet reads it,
        # not noted as the samples' code reading a gradient)
        grad = context.GRAD_OF(array)
        if grad is not None:
            graph.variables[id(array)] = array
            if grad.stype != "default":     # ``attach_grad(stype="row_sparse")``
                graph.sparse_grad_leaves.add(node)
        if type(array) is LazyArray and array.history_freed():
            node.value = array.detach()      # as eager uses it: a constant
            warn_once("freed", "%s: a value computed in an earlier batch is used after a "
                       "backward pass freed the batched steps that computed it; it is used as "
                       "a constant (no gradient flows into that earlier batch), as eager MXNet "
                       "uses arrays whose graph a pass freed", describe_call(self.sample, self.path))
        elif type(array) is LazyArray and array._h is not None and array._node is None \
                and array.stype != "default":
            # A sparse result computed by itself (``alone.run_alone``), held by a
            # LazyArray: the array of its storage's class, with its history.
            node.value = mx.nd.identity(array)
        if isinstance(node.value, BaseSparseNDArray):
            graph.sparse_leaves.add(node)
            if node.value.stype == "csr":
                node.value = summed_duplicates(node.value)
        if described[3]:
            node.value = _on_cpu(node.value)
        node.out_shapes = (described[1],)
        node.out_dtypes = (described[2],)
        lazy = LazyArray(node, 0)
        # The array it stands for: its gradient (``lazy.given_array``), where a
        # sample's writes go (``arithmetic.written_array``).
        lazy._given = array
        graph.leaf_by_id[id(array)] = (node, lazy, array)
        return lazy

    def _rows_leaf_of(self, view, base, begin, end):
        """What stands for ``view``, NDArray's view of rows ``begin:end`` of a
        plain array ``base`` (``self.table[word]`` inside a sample,
        ``aliases.outside_rows``): those rows of ``base``'s value in the graph,
        reshaped as ``view`` is (``x[i]`` drops the axis); None where the view
        is a leaf of its own."""
        graph = self.graph
        if len(graph.nodes) + 3 >= self.max_pending \
                or self._mode_seen != context.MODE_CHANGES[0]:
            return None                 # (the nodes below must not start a new graph)
        source = self.leaf(base)
        if source._node is None or getattr(source._node, "graph", None) is not graph:
            return None
        lazy = self._rows_of(source, begin, end)
        if lazy.shape != view.shape:
            lazy = self.add_node(_RESHAPE, [(lazy._node, 0)], _ONE_SLOT, {"shape": view.shape})
            lazy._node.outs = None      # held by ``leaf_by_id``, not by a user
        graph.leaf_by_id[id(view)] = (lazy._node, lazy, view)
        return lazy

    def _described_leaf(self, array):
        """``(array, shape, dtype, shared)`` of a new leaf's array; its context
        checked, an array in shared CPU memory (``cpu_shared``: what Gluon's
        ``DataLoader`` workers and gluonnlp's ``batchify`` give) taken as on the CPU.

        Asking an NDArray its shape, context and dtype takes ~20 us of ctypes
        calls; a sample that reads values starts a graph per read and makes
        a leaf of the same arrays (an embedding table) in each, so the
        answers for plain NDArrays (whose shape and context never change)
        are kept for the graph and the next one.
        """
        current, before = self._described
        found = current.get(id(array))
        if found is None:
            found = before.get(id(array))
        if found is not None and found[0] is array and self.ctx is not None:
            current[id(array)] = found
            return found
        ctx = array.context
        shared = ctx.device_type == "cpu_shared"
        self._set_ctx(mx.cpu(ctx.device_id) if shared else ctx)
        found = (array, array.shape, array.dtype, shared)
        if type(array) is NDArray:
            current[id(array)] = found
        return found

    def _where(self):
        """``describe_call`` of the call recorded now; in a sample's own code
        between its calls of blocks (a ``gdb.map`` function), that code."""
        task = self.tasks.current
        if self.sample is None and task is not None:
            if task.sample is None:
                return "a sample's own code (a gdb.map function, between its calls of blocks)"
            return describe_call(task.sample, self.path)
        return describe_call(self.sample, self.path)

    def before_write(self, arrays, gradients=False):
        """``arrays`` are about to be written in place (``x[:] = ...``, ``x += y``,
        an optimizer's update of a parameter): if a pending call reads one, what
        is pending runs first, with the values eager code ran it with.

        Inside a sample this is a read (the sample waits, ``scope.read``);
        between samples, a flush.  Samples waiting at a read that were given
        one of ``arrays`` (an input buffer refilled for the next sample) finish
        first, as eager code finished them before the write.  ``gradients``:
        ``arrays`` are gradients (``zero_grad``), see ``_after_earlier_samples``.
        """
        for array in arrays:
            if type(array) is LazyArray and array._node is None:
                array._base = None      # its base (``bases.py``) keeps the old values
        tasks = self.tasks
        if tasks.current is not None and (gradients or self._gradients_among(arrays)
                                          or self._written_by_earlier(arrays)):
            self._after_earlier_samples()
        now = tasks.current is not None and self._weights_among(arrays)
        if now and self._other_samples():
            raise BatchingError(
                "%s: weights are written in place inside a sample (p.set_data, p.data()[:] "
                "= ..., trainer.step) while other samples have started and not finished "
                "(waiting at a read or at a change of autograd's mode, or in gdb.map): they "
                "may have read the weights already, where eager code runs each sample's write "
                "before the next sample starts and after the one before it ends. Write "
                "weights outside the samples' calls (in the scope's own code between them, "
                "or after the scope), or run such a model eagerly" % self._where())
        if not now and tasks.current is not None and self._outside_among(arrays) \
                and not self._other_samples():
            now = True
        if tasks.current is None and tasks.waiting:
            if self._weights_among(arrays):
                # (``trainer.step()`` in the loop: eager's samples finished first)
                warn_once("weights written while waiting", "%s: weights are written in "
                          "place while samples wait at a read; they finish first, with the "
                          "old weights, as in eager code", describe_call(self.sample, self.path))
                tasks.drain()
            elif tasks.holding(arrays):
                warn_once("written while waiting", "%s: an array a sample waiting at a read "
                          "was given is written in place; the waiting samples finish first, "
                          "with its old values, as in eager code (give each sample an array "
                          "of its own to batch them)", describe_call(self.sample, self.path))
                tasks.drain()
        with_frame = True
        while self._written_are_read(arrays, with_frame):
            # Weights, or arrays from outside the samples, that a sample writes with
            # no other sample started: what is pending runs now (a flush), so the
            # next sample starts with the new values, as eager's did.
            self._run_pending("written", "an array that recorded calls read is written "
                              "in place; they run first, with its old values, as in "
                              "eager code", "an array it read is written in place", now)
            if self.tasks.current is None or now:
                return                  # a flush: nothing is pending
            # This sample waited, its frame cut: other samples may have read
            # the array meanwhile (each refilling a shared buffer).
            with_frame = False

    def _gradients_among(self, arrays):
        """Whether one of ``arrays`` shares memory with a gradient a backward pass
        adds into: of a parameter with ``grad_req="add"`` (of the scope's block,
        or read by recorded calls), or of an array given a gradient that recorded
        calls or the samples' code read."""
        params = self._called_parameters()
        params += list(self.graph.parameters.values()) + list(context.TLS.batched_params.values())
        grads = [grad for param in params if getattr(param, "grad_req", None) == "add"
                 for grad in (getattr(param, "_grad", None) or ())]
        variables = list(context.TLS.batched_variables.values())
        # (``NDArray.grad`` itself: ``LazyArray.grad`` copies, which writes)
        grads += [context.GRAD_OF(array)
                  for array in variables + list(self.graph.variables.values())]
        grads += self.tasks.gradients_read
        grads = [grad for grad in grads if grad is not None]
        if not grads:
            return False
        index = aliases.memory_index(grads)
        return any(aliases.in_index(array, index) for array in arrays)

    def _written_by_earlier(self, arrays):
        """Whether a sample before this one (eager's order) that has not finished
        wrote one of ``arrays`` from outside the scope (a mask on the model
        refilled per sample under ``autograd.pause()``): eager code ran that
        sample to its end, reads of the array included, before this write.
        Notes this sample as their writer."""
        me, writers, earlier = self.tasks.current, self._outside_writers, False
        for array in arrays:
            if type(array) is LazyArray:
                continue
            found = writers.get(id(array))
            if found is not None and found[0] is array and found[1] is not me \
                    and not found[1].done and found[1].order < me.order \
                    and id(found[1]) not in _callers(me):
                earlier = True
            writers[id(array)] = (array, me)
        return earlier

    def given_to_others(self, array):
        """Whether samples other than the running one, started and not finished,
        were given ``array`` (or an array sharing its memory)."""
        me = self.tasks.current
        return me is not None and self.tasks.given_to_others(array, me, _callers(me))

    def _other_samples(self):
        """Whether samples other than the running one have started and not
        finished (not those that wait for it to finish: its callers'
        ``gdb.map``)."""
        me = self.tasks.current
        callers = _callers(me)
        return any(not task.done and task is not me and id(task) not in callers
                   for task in self.tasks.started + self.tasks.waiting)

    def before_own_pass(self):
        """A sample's own backward pass adds into gradients (a parameter of a block
        called with ``grad_req="add"``): the samples before it finish first, as
        eager ran their passes and reads of those gradients first."""
        if any(param.grad_req == "add" for param in self._called_parameters()):
            self._after_earlier_samples()

    def _called_parameters(self):
        """The parameters of the top-level blocks called in this scope (a new list,
        collected once per block called)."""
        found = self._called_params
        if found[0] != len(self.blocks_called):
            owner = self.owner      # (its parameters as ``param_table`` found them)
            params = list({id(param): param for _, param in self.param_table().values()}.values())
            params += [param for block in list(self.blocks_called.values()) if block is not owner
                       for param in trie.parameters(block)]
            found = self._called_params = (len(self.blocks_called), params)
        return list(found[1])

    def _after_earlier_samples(self):
        """Wait until the samples before this one (eager's order) have finished (but for
        those waiting for another sample's result): a sample's write into
        gradients a pass adds into (``zero_grad()`` before its own
        ``backward()``, per-sample gradients with ``grad_req="add"``) comes
        after the passes of the samples before it, as in eager code.

        While it waits it is blocked on the first of them (``Tasks.drain``): its
        autograd modes choose no round's, so the earlier samples' rounds run.
        """
        tasks = self.tasks
        me = tasks.current
        if me is None:
            return
        callers = _callers(me)          # (they wait for this sample: not before it)
        while True:
            earlier = [task for task in tasks.started if task.order < me.order
                       and not task.done and task.blocked is None and id(task) not in callers]
            if not earlier:
                return
            if self.frame is not None:
                self.frame.cut("gradients are written")
            me.blocked = earlier[0]
            try:
                tasks.wait()
            finally:
                me.blocked = None

    def _weights_among(self, arrays):
        """Whether one of ``arrays`` is the data of a parameter: of the scope's
        block, or read by a pending call."""
        table, read = self.param_table(), self.graph.param_arrays
        for array in arrays:
            found = table.get(id(array))
            if found is not None and found[0] is array or read.get(id(array)) is array:
                return True
        return False

    @staticmethod
    def _outside_among(arrays):
        """Whether one of ``arrays`` was not made in the scope (a model's attribute,
        a global, the caller's input: the samples after the writer may read it);
        arrays a scope makes are LazyArrays."""
        return any(type(array) is not LazyArray for array in arrays)

    def _written_are_read(self, arrays, with_frame):
        """Whether a pending call (of the current frame too: ``with_frame``) reads
        one of ``arrays`` or an array sharing memory with one."""
        return any(self._read_by_pending(array, with_frame) for array in arrays) \
            or any(aliases.shares_with_pending(self, array, with_frame) for array in arrays)

    def before_replace(self, parameter, what=None):
        """``parameter``'s arrays are about to be replaced by new ones
        (``initialize(force_reinit=True)``, ``cast``, ``reset_ctx``), or its
        gradient arrays (``grad_req`` set: ``what`` says so): pending calls that
        read them run first, with the old arrays, as eager code ran them; later
        calls read the new ones.  Samples waiting at a read finish first when the
        scope's own code replaces them, as eager's samples had; inside a sample,
        while other samples have started, it is refused (see ``before_write``)."""
        self._param_tables.clear()
        arrays = list(getattr(parameter, "_data", None) or ())
        what = what or ("a parameter that recorded calls read is given new arrays "
                        "(initialize(force_reinit=True), cast, reset_ctx)")
        if not (self._weights_among(arrays) or self._reads_parameter(parameter, arrays)):
            return
        tasks = self.tasks
        if tasks.current is None and tasks.waiting:
            warn_once("weights replaced while waiting", "%s while samples wait at a read; "
                      "they finish first, with its old arrays, as in eager code" % what)
            tasks.drain()
        now = tasks.current is not None
        if now and self._other_samples():
            raise BatchingError(
                "%s: %s inside a sample while other samples have started and not finished "
                "(waiting at a read or at a change of autograd's mode, or in gdb.map): they "
                "may have read it already, where eager code runs each sample's change "
                "before the next sample starts and after the one before it ends. Change it "
                "outside the samples' calls (in the scope's own code between them, or "
                "after the scope), or run such a model eagerly" % (self._where(), what))
        if self._reads_parameter(parameter, arrays):    # (the rounds above may have run them)
            self._run_pending("replaced", "%s; they run first, with its old arrays, as in "
                              "eager code" % what, "a parameter it read is given new arrays",
                              now)

    def _reads_parameter(self, parameter, arrays):
        """Whether a pending call reads ``parameter`` (as a leaf) or its ``arrays``."""
        found = self.graph.leaf_by_id.get(id(parameter))
        return found is not None and found[2] is parameter \
            or any(self._read_by_pending(a) for a in arrays)

    def before_new_gradient(self, array, warn=True):
        """``array`` is about to be given a gradient (``attach_grad``): pending calls
        that read it run first, as eager ran them, without it (a gradient
        attached later reaches only the calls made after).  ``warn``: say so
        (not for a sample's own input, which a sample gives its gradient at its
        start, as a rule)."""
        if not self._read_by_pending(array):
            return
        now = self.tasks.current is not None and not self._other_samples()
        self._run_pending("new gradient", "an array that recorded calls read is given a "
                          "gradient (attach_grad); they run first, without it, as in eager "
                          "code", "an array it read is given a gradient", now, warn)

    def _read_by_pending(self, array, with_frame=True):
        """Whether a pending call (of the current frame too: ``with_frame``) reads
        ``array``."""
        graph, frame = self.graph, self.frame if with_frame else None
        found = graph.leaf_by_id.get(id(array))
        return found is not None and found[2] is array \
            or graph.param_arrays.get(id(array)) is array \
            or frame is not None and frame.vals.get(frame.ext.get(id(array))) is array

    def _run_pending(self, kind, what, reason, now=False, warn=True):
        """Run what is pending (see ``before_write``), warning once per ``kind`` of
        ``what`` (unless not ``warn``): a sample waits for it, unless ``now`` (a
        flush)."""
        if warn:
            warn_once(kind, "%s: %s (calls recorded before it do not batch with those "
                      "after it: give each sample an array of its own to batch them)",
                      describe_call(self.sample, self.path), what)
        if self.frame is not None:
            self.frame.cut(reason)
        if self.tasks.current is not None and not now:
            self.read()
        else:
            self.flush()

    def _relazy(self, found):
        """A new LazyArray of leaf ``found`` (``leaf_by_id``'s entry), whose
        LazyArray was read as a plain array (``LazyArray._compute`` copied it out
        of the graph)."""
        node, _, value = found
        lazy = LazyArray(node, 0)
        lazy._given = value
        self.graph.leaf_by_id[id(value)] = (node, lazy, value)
        return lazy

    def param_table(self):
        """``id(array) -> (array, Parameter)`` of the owner's parameters' data, built
        once per scope (a scope whose samples read values has a graph per flush);
        ``leaf`` checks the array's identity, so an array no longer a parameter's
        data is not taken for it."""
        owner = self.owner
        found = self._param_tables.get(id(owner))
        if found is None or found[0] is not owner:
            table = {}
            for param in (trie.parameters(owner) if owner is not None else ()):
                for data in (param._data or ()):  # pylint: disable=protected-access
                    table[id(data)] = (data, param)
            found = self._param_tables[id(owner)] = (owner, table)
        return found[1]

    def param(self, parameter):
        """The LazyArray of a gluon Parameter (or ``weight_calls.DerivedWeight``)."""
        graph = self.graph
        found = graph.leaf_by_id.get(id(parameter))
        if found is not None:
            return found[1] if found[1]._node is not None else self._relazy(found)
        if type(parameter) is weight_calls.DerivedWeight:
            return weight_calls.resolve(self, parameter)
        if getattr(parameter, "_data", True) is None \
                and not getattr(parameter, "_deferred_init", ()):
            parameter.data()        # never initialised: Gluon's error, as eager raises it
        if type(parameter).data is not _PARAMETER_DATA:
            _warn_data_read_once(parameter)
        node = graph.add(Node(graph, LEAF))
        node.param = parameter
        graph.parameters[id(parameter)] = parameter
        for data in getattr(parameter, "_data", None) or ():   # written in place by updates
            graph.param_arrays[id(data)] = data
        node.out_shapes = (tuple(parameter.shape),)
        node.out_dtypes = (np.dtype(parameter.dtype).type,)
        lazy = LazyArray(node, 0)
        graph.leaf_by_id[id(parameter)] = (node, lazy, parameter)
        return lazy

    def params_of(self, block):
        """A block's own parameters as lazy values, by name (one dict per graph).

        Every recursive call of a DynBatchBlock passes them; building the dict
        once per graph saves a lookup per parameter per call.
        """
        graph = self.graph
        found = graph.param_dicts.get(id(block))
        if found is None or found[0] is not block:
            found = graph.param_dicts[id(block)] = (
                block, {name: self.param(p) for name, p in block._reg_params.items()})
        return found[1]

    def slow_value_of(self, x):
        """(node, index) of array ``x`` in the current graph (``RecorderCore.value_of``
        answers values of this graph and arrays to make leaves of)."""
        if isinstance(x, LazyArray):
            node = x._node
            if node is None and type(x) is Pending:   # a waiting sample's result
                node = x.settled_node()
            if node is not None and node.graph is self.graph:
                return node, x._idx
            if type(node) is Frame:         # a value of a call still recording
                node.cut("its value is used outside it")
                return self.value_of(x)
            if node is not None and node.kind == LEAF and node.param is not None:
                # A parameter passed to a call before a flush (autograd's modes
                # changed inside it): the same parameter in this graph.
                return self.value_of(self.param(node.param))
            if node is not None and node.kind == LEAF and node.value is not None:
                # A sample's input wrapped before a flush (a read, a change of
                # modes): the array it stands for, a leaf of this graph too.
                # (Run, it would be a copy made in the modes of now: under
                # ``autograd.pause()``, one without the array's gradient.)
                lazy = self.leaf(node.value)
                if getattr(lazy._node, "graph", None) is self.graph:
                    return lazy._node, lazy._idx
            if node is not None:          # pending in an older graph: run it
                x.handle  # pylint: disable=pointless-statement
        lazy = self.leaf(x)
        return lazy._node, 0

    def wrap_inputs(self, obj):
        """Replace NDArrays in (nested lists/tuples of) ``obj`` by lazy leaves."""
        if isinstance(obj, LazyArray):
            node = obj._node
            if node is None and type(obj) is Pending:   # a waiting sample's result
                node = obj.settled_node()
            if node is not None and node.graph is self.graph:
                return obj
            return self.leaf(obj) if node is None else obj
        if isinstance(obj, mx.nd.NDArray):
            # An ``mx.np`` array (``F.np.cumsum`` run on concrete values) stays
            # as eager has it: the graph's leaves are legacy arrays.
            return obj if isinstance(obj, mx.np.ndarray) else self.leaf(obj)
        if isinstance(obj, (list, tuple)) and any(
                isinstance(o, (mx.nd.NDArray, list, tuple)) for o in obj):
            wrapped = [self.wrap_inputs(o) for o in obj]
            return wrapped if isinstance(obj, list) else type(obj)(wrapped) \
                if type(obj) is tuple else type(obj)(*wrapped)
        return obj

    def wrap_arguments(self, args):
        """The arguments of a top-level call, with NDArrays as lazy leaves.

        Only arrays passed directly or inside tuples are wrapped.  Lists,
        dicts and other containers keep their identity: a model may append
        to a list its caller passed (per-node losses), and the caller must
        see those appends.  Arrays inside them are used as they are (an
        operator reading one records it as a leaf when it runs).
        """
        return tuple(self._wrap_argument(a) for a in args)

    def _wrap_argument(self, obj):
        if isinstance(obj, mx.nd.NDArray):
            return self.wrap_inputs(obj)
        if isinstance(obj, tuple):
            wrapped = [self._wrap_argument(o) for o in obj]
            return tuple(wrapped) if type(obj) is tuple else type(obj)(*wrapped)
        return obj

    def rebind(self, lazy, result):
        """Make LazyArray ``lazy`` stand for ``result``'s value (an in-place update).

        Returns ``lazy``.  Its old value stays what other nodes read; only
        the object (and so every alias of it) now holds the new one.
        """
        node = lazy._node
        if type(node) is Frame:
            _rebase(lazy, result)
            if result._node is node:          # both values of the recording frame
                lazy._idx = result._idx
                return lazy
            node.lazies.remove(lazy)
            node = result._node
            lazy._node, lazy._idx = node, result._idx
            node.outs[lazy._idx] = weakref.ref(lazy)
            result._node = None
            return lazy
        if node is None or node.kind == LEAF:     # (None: a constant a flush handed out)
            raise BatchingError(
                "%s: in-place update (x += y) inside a batching scope of an array no "
                "recorded call of the sample computed (a value computed before it was given to "
                "the sample, or a constant such as F.zeros(...)); "
                "write x = x + y instead" % describe_call(self.sample, self.path))
        if node.graph is not self.graph:
            lazy.handle  # pylint: disable=pointless-statement  (runs its graph)
            return lazy
        if node.outs is not None and node.outs[lazy._idx] is not None \
                and node.outs[lazy._idx]() is lazy:
            node.outs[lazy._idx] = None
        if type(result._node) is Frame:
            # A child call's result updated in its caller's frame: the frame may
            # have read the array as an outside value, so its new value is put
            # in the graph rather than left a value of the frame.
            result._node.cut("an in-place update of a value it read")
        new, idx = result._node, result._idx
        lazy._node, lazy._idx, lazy._base = new, idx, result._base
        new.outs[idx] = weakref.ref(lazy)
        result._node = None
        return lazy

    # -- operator calls -----------------------------------------------------------------
    def record(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)``, a call as the user wrote it; its output(s).

        Attributes given by position become keywords (rules read them by
        name), and those written as strings are read as MXNet reads them.
        Unless the recording is ``faithful``, the passes of ``passes.BY_NAME``
        may record it in another form.
        """
        if op.arrays is not None and len(args) > op.arrays:   # F.swapaxes(x, 0, 1)
            args, kwargs = op.named(args, kwargs)
        if kwargs:
            args, kwargs = positional(op, args, kwargs)     # ``F.dot(rhs=b, lhs=a)``
        if kwargs:                              # transpose_b="False": rules read values
            kwargs = typed_attributes(op, kwargs)
        for a in args:
            if type(a) is Pending:
                # Results of waiting samples (``outs[0] + outs[1]``) are settled
                # before any input is looked up: settling one runs flushes, which
                # would leave an input looked up before it in a graph run already.
                a.settled_node()
        if not self.faithful() and not self._sparse(args):
            for fn in passes.BY_NAME.get(op.name, ()):
                found = fn(self, op, args, kwargs)
                if found is not None:
                    return passes.checked(self, fn, op, args, kwargs, found)
        return self.record_plain(op, args, kwargs)

    def _sparse(self, args):
        """Whether a call's arguments hold a sparse array (CSR, row-sparse) or a
        leaf of one: the passes' forms of the call (``broadcast_mul`` for a
        product) would keep only its stored entries, so such calls are
        recorded as written."""
        leaves = self.graph.sparse_leaves
        for a in args:
            if isinstance(a, BaseSparseNDArray) or leaves and type(a) is LazyArray \
                    and a._node in leaves:
                return True
        return False

    def record_plain(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)`` without its operator's passes: a pass of
        ``passes.ON_BASES`` where it reads a reshaped value, else as it is (a row
        slice or concatenation as a view)."""
        if args and not self.faithful():
            first = args[0]
            if (type(first) is LazyArray and first._base is not None or len(args) == 2
                    and type(args[1]) is LazyArray and args[1]._base is not None) \
                    and not self._sparse(args):
                for fn in passes.ON_BASES:
                    found = fn(self, op, args, kwargs)
                    if found is not None:
                        return passes.checked(self, fn, op, args, kwargs, found)
        form = _FORMS.get(op.name)
        if form is not None:
            found = form(self, op, args, kwargs)
            if found is not None:
                return found
        return self.call_op(op, args, kwargs)

    def call_op(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)``; return its LazyArray output(s)."""
        frame = self.frame
        if frame is not None:
            if self._mode_seen == context.MODE_CHANGES[0] or self.same_mode():
                return frame.op(op, args, kwargs)
            frame.fallback("autograd's mode changed")
        return self.graph_op(op, args, kwargs)

    def own_copy(self, x):
        """A LazyArray copying ``x`` by a node of its own, never the node another
        sample's call on the same weights made."""
        if self.frame is not None:
            self.frame.fallback("a sample's result is copied")
        if self._mode_seen != context.MODE_CHANGES[0]:
            self.sync_mode()            # may flush: before the input is looked up
        return self.add_node(_IDENTITY, [self.value_of(x)], slots_of(1), {})

    def graph_op(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)`` as a node of the graph, frame or not."""
        self.num_calls += 1
        if self._mode_seen != context.MODE_CHANGES[0]:
            self.sync_mode()            # may flush: before the inputs are looked up
        graph = self.graph
        if len(graph.nodes) >= self.max_pending:
            # Bounded memory: run what is pending (every value still held is
            # computed), then record on into a fresh graph.
            self._flush()
        elif not kwargs and not graph.weight_nodes:
            inputs = pending_inputs(graph, args)         # the common case
            if inputs:
                try:
                    return self.add_node(op, inputs, slots_of(len(inputs)), {})
                except calls.ShapeFromData:
                    return run_alone(self, op, args, kwargs)
        arrays = []
        targs = []
        for a in args:
            if isinstance(a, NDArray):
                targs.append(slot(len(arrays)))
                arrays.append(a)
            else:
                targs.append(a)
        inputs = [self.value_of(a) for a in arrays]
        tkw = {}
        if kwargs:
            for k, v in kwargs.items():
                if k == "name":
                    continue
                if isinstance(v, NDArray):
                    tkw[k] = slot(len(inputs))
                    inputs.append(self.value_of(v))
                else:
                    tkw[k] = v
        if not inputs:
            return self.constant(op, args, kwargs)
        try:
            if weight_calls.on_weights(self, op, inputs, targs, tkw):
                return weight_calls.shared_call(self, op, inputs, tuple(targs), tkw)
            return self.add_node(op, inputs, tuple(targs), tkw)
        except calls.ShapeFromData:       # its output shape depends on its data
            return run_alone(self, op, args, kwargs)

    def slow_row_slice(self, x, begin, end):
        """Rows ``begin:end`` of array ``x``: ``x[i:j]`` and ``F.slice_axis(x, axis=0, ...)``.

        A word's row of an embedding table, a label's row of a constant table:
        models take one per tree node, so once the call shape is known the
        view node is made here directly, without the generic ``graph_op``.
        Rows of a value of the recording frame are a call of the frame.
        """
        if self.frame is not None and type(x) is LazyArray and x._node is self.frame:
            found = passes.sliced(self, x, 0, begin, end) if passes.SLICES else None
            if found is not None:
                return found
            return self.call_op(_SLICE_AXIS, (x,), {"axis": 0, "begin": begin, "end": end})
        graph = self.graph
        if len(graph.nodes) >= self.max_pending:
            self._flush()
            graph = self.graph
        if self._mode_seen != context.MODE_CHANGES[0]:
            self.sync_mode()
            graph = self.graph
        self.num_calls += 1
        src = x._node if type(x) is LazyArray else None
        if src is not None and src.graph is graph:
            idx = x._idx
            value = (src, idx)
        else:
            value = self.value_of(x)
            src, idx = value
        shape = src.out_shapes[idx]
        if not (type(begin) is int and type(end) is int and 0 <= begin < end <= shape[0]):
            return self.graph_op(_SLICE_AXIS, (x,), {"axis": 0, "begin": begin, "end": end})
        return self._view_rows(value, begin, end)

    def _rows_of(self, base, begin, end):
        """Rows ``begin:end`` of ``base``, a LazyArray of this graph, as a view
        node (no flush, no call counted: ``leaf`` makes it for a value handed out)."""
        lazy = self._view_rows((base._node, base._idx), begin, end)
        lazy._node.outs = None      # held by ``leaf_by_id``, not by a user: no output
        return lazy

    def _view_rows(self, value, begin, end):
        """The view node of rows ``begin:end`` of graph value ``value``; its LazyArray."""
        src, idx = value
        graph = self.graph
        shape = src.out_shapes[idx]
        # The rows' analysis does not depend on how many rows the source has
        # (the bounds are checked by the callers): values handed out by a flush
        # are rows of arrays whose row count changes from flush to flush.
        found = _ROW_SLICES.get((begin, end, shape[1:], src.out_dtypes[idx]))
        if found is None:
            kwargs = {"axis": 0, "begin": begin, "end": end}
            key = (_SLICE_AXIS, _ONE_SLOT, (("axis", 0), ("begin", begin), ("end", end)),
                   (shape,), (src.out_dtypes[idx],))
            info = calls.INFOS.get(key) or _moved_row_slice(begin, end, key)
            if info is None:    # analysed here: ``add_node`` may start a new graph
                probe = Node(graph, OP, _SLICE_AXIS, [value], _ONE_SLOT, kwargs)
                info = calls.analyse(probe, key[3], key[4])
                calls.remember(key, info)
            if info.kind != VIEW:
                return self.add_node(_SLICE_AXIS, [value], _ONE_SLOT, kwargs)
            if len(_ROW_WIDTHS) < MAX_ROW_WIDTHS:
                _ROW_WIDTHS[(end - begin, shape[1:], src.out_dtypes[idx])] = info
            # Nodes never change their kwargs: views of the same rows share one dict.
            found = _ROW_SLICES[(begin, end, shape[1:], src.out_dtypes[idx])] = (
                info, kwargs, _SLICE_AXIS, _ONE_SLOT)
        info, kwargs = found[:2]
        if graph.mode is None:
            graph.mode = self.mode
        node = analysed_node(graph, VIEW, _SLICE_AXIS, (value,), _ONE_SLOT, kwargs, info,
                          self.sample, self.path)
        node.depth = src.depth
        graph.nodes.append(node)
        self.num_recorded += 1
        lazy = LazyArray(node, 0)
        node.outs = [weakref.ref(lazy)]
        return lazy

    def constant(self, op, args, kwargs):
        """An operator without array inputs (zeros, random, ...) runs now."""
        return self.make_constant(op.nd_fn, op.path, args, kwargs)

    def make_constant(self, fn, path, args, kwargs):
        """Call creation function ``fn`` now and return its result as leaves.

        Deterministic ones (zeros, ones, full, ...) are computed once per
        context and reused: users only ever see copies of leaves.
        """
        if kwargs and "name" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "name"}
        kwargs = kwargs or {}
        ctx = self.ctx or mx.current_context()
        store = self._store
        key = out = None
        if path[-1] in DETERMINISTIC:
            key = (path, args, tuple(sorted(kwargs.items())) if kwargs else (),
                   ctx.device_typeid, ctx.device_id)
            try:
                out = store.constants.get(key)
            except TypeError:           # an unhashable argument: no memo
                key = None
        if out is None:
            # A copy of the context: entering the user's own object (the one
            # their ``with mx.cpu(1):`` entered) would overwrite the context it
            # restores on exit.
            with mx.Context(ctx):
                out = fn(*args, **kwargs)
            if key is not None and len(store.constants) < 1024:
                store.constants[key] = out
                for array in (out if isinstance(out, (list, tuple)) else [out]):
                    store.constant_ids[id(array)] = array
        if isinstance(out, (list, tuple)):
            return [self._constant_leaf(o) for o in out]
        return self._constant_leaf(out)

    def _constant_leaf(self, array):
        """A LazyArray of its own for each call of a creation function: eager
        makes a new array at each call, so one sample's in-place write (``out=``,
        ``copyto``) must not reach another's (the leaf's LazyArray is shared)."""
        shared = self.leaf(array)
        if shared._node is None:
            return shared
        own = LazyArray(shared._node, shared._idx)
        self.graph.held.append(own)     # (frames key it by ``id``: ``Frame.ref``)
        return own

    def add_node(self, op, inputs, targs, tkw):
        """Create, analyse and sign one op node; return its LazyArray output(s)."""
        if self._mode_seen != context.MODE_CHANGES[0]:
            self.sync_mode()
        graph = self.graph
        if graph.mode is None:
            graph.mode = self.mode
        in_shapes = tuple([src.out_shapes[i] for src, i in inputs])
        in_dtypes = tuple([src.out_dtypes[i] for src, i in inputs])
        key, info = _memo(op, targs, tkw, in_shapes, in_dtypes)
        facts = None
        if info is None and key is not None and calls.source_dependent(op):
            facts = calls.source_facts(inputs)
            info = calls.INFOS.get((key, facts))
        sparse = self._reads_sparse(inputs)     # (the memo does not know storage)
        if info is None or sparse:
            node = Node(graph, OP, op, inputs, targs, tkw)
            node.sample = self.sample
            node.path = self.path
            info = calls.analyse(node, in_shapes, in_dtypes)
            if not sparse:
                calls.remember(key, info, facts)
            node.out_shapes, node.out_dtypes = info.out_shapes, info.out_dtypes
            node.attrs, node.rule, node.meta, node.info = info.attrs, info.rule, info.meta, info
        else:
            node = analysed_node(graph, OP, op, inputs, targs, tkw, info, self.sample, self.path)
        self.place(node, info)
        graph.nodes.append(node)
        self.num_recorded += 1
        if len(info.out_shapes) == 1:
            lazy = LazyArray(node, 0)
            node.outs = [weakref.ref(lazy)]
            return lazy
        outs = [LazyArray(node, i) for i in range(len(info.out_shapes))]
        node.outs = [weakref.ref(lazy) for lazy in outs]
        return outs

    def place(self, node, info):
        """Kind, signature and depth of a new node.

        Depth is 1 + the largest depth among the inputs (views pass their
        inputs' depth on; leaves have 0).  Which op nodes a node waits for is
        derived when a planner needs it (``graph.op_deps``); only extra
        ordering constraints are stored in ``node.deps``.  (``_core._place`` is
        this for calls neither stateful nor with shared inputs, compiled: keep
        the two alike.)
        """
        depth = 0
        for src, _ in node.inputs:
            if src.depth > depth:
                depth = src.depth
        if info.stateful and self.mode[1]:
            # Operators that update state (BatchNorm's running statistics) keep
            # their recording order: each waits for the previous one.
            previous = self.last_stateful
            if previous is not None and previous.graph is node.graph:
                node.deps = (previous,)
                if previous.depth > depth:
                    depth = previous.depth
                warn_once(node.op.name, calls.STATEFUL_WARNING, node.op.name)
            self.last_stateful = node
        if info.kind == VIEW:
            node.kind = VIEW
            node.depth = depth
            return
        node.depth = depth + 1
        if info.link:
            node.graph.links.append(node)
        if info.sig is None:
            node.sig = ("alone", node.graph, node.id)
        elif info.shared_pos:
            if info.low and info.rule.refine(node, info):
                return
            inputs = node.inputs
            node.sig = (info.sig, tuple([(inputs[k][0].id, inputs[k][1])
                                         for k in info.shared_pos]))
        else:
            node.sig = info.sig

    # -- frames -----------------------------------------------------------------------
    def frames_on(self):
        """Whether calls are recorded as frames (``frames.py``).

        They are unless the scope records operator by operator
        (``granularity="op"``, or the reference strategy).
        """
        if self.frames is None:
            scope = self.scope
            self.frames = scope is None or (scope.granularity_now() == "call"
                                            and not scope.reference_now())
        return self.frames

    def faithful(self):
        """Whether calls are recorded exactly as written, no pass rewriting them:
        the reference strategy's recording, the oracle of the tests."""
        found = self._faithful
        if found is None:
            found = self._faithful = self.scope is not None and self.scope.reference_now()
        return found

    def frame_root(self, block, helper=None):
        """The root of ``block``'s template trie for calls recorded now (of its
        recursive helper method of code ``helper``, if given)."""
        if self._mode_seen != context.MODE_CHANGES[0]:
            self.sync_mode()
        key = (id(block), self.mode, helper)
        found = self._roots.get(key)      # this scope's, while the modes hold
        if found is None or found.counter[0] >= trie.MAX_STATES:
            found = self._roots[key] = trie.root(
                (self.block_identity(block), self.block_version(block), self.mode,
                 self.replay, helper), block)
        return found

    def block_token(self, block):
        """A small int naming ``block``, its parameters and settings in this thread;
        with the values of what else its code reads, if anything (a global, a
        class attribute, a dict of settings: ``purity.replay_guards``), read at
        every call, as a replay holds for those values only."""
        found = self._tokens.get(id(block))
        if found is not None:
            return found
        guarded = self._guarded.get(id(block))
        if guarded is None:
            settings = trie.settings(block)
            token = trie.token(
                (self.block_identity(block), self.block_version(block), settings,
                 purity.code_version(block)), block)
            guards = None if settings is None else purity.replay_guards(block)
            if not guards:
                if guards is None:
                    self._unreplayable.add(id(block))
                    # (keys apart from replays learned while it could replay:
                    # a hook put on a block inside it since then)
                    token = (token, _RUNS_ITS_CODE)
                self._tokens[id(block)] = token
                return token
            guarded = self._guarded[id(block)] = (token, guards)
        token, guards = guarded
        values = tuple([space.get(name) for space, name in guards])
        if purity.UNFROZEN in values:   # now a value no key holds (a global set to an object)
            self._unreplayable.add(id(block))
        return (token,) + values

    def replays(self, block):
        """Whether calls of child ``block`` may be replayed without running its
        code (``purity``), in this scope."""
        if id(block) not in self._tokens and id(block) not in self._guarded:
            self.block_token(block)
        return self.replay and id(block) not in self._unreplayable

    def forget_tokens(self):
        """Make the blocks' tokens anew (a block's setting or child changed)."""
        self._tokens.clear()
        self._guarded.clear()
        self._unreplayable.clear()
        self._versions.clear()

    def block_identity(self, block):
        """What names ``block`` in the tries: ``id(block)``, or the key of blocks
        made alike (``trie.likeness``).  The scope keeps ``block`` alive, so the
        ids its caches are keyed by name one block each."""
        found = self._identities.get(id(block))
        if found is None:
            like = trie.likeness(block)
            found = self._identities[id(block)] = (block, id(block) if like is None else like)
        return found[1]

    def block_version(self, block):
        """Identity, shapes and dtypes of ``block``'s parameters (once per scope)."""
        found = self._versions.get(id(block))
        if found is None:
            found = self._versions[id(block)] = trie.version(block)
        return found

    def block_frame(self, block, args):
        """A child block called outside any frame: recorded as a frame of its own."""
        frame = self.frame = Frame(self, self.frame_root(block), block,
                                   self.path + (block.name,))
        try:
            out = frame.call_block(block, args)     # (compiled: ``_core.FrameCore``)
            if out is NOT_RECORDED:
                frame.fallback("arguments templates cannot describe")
                return self.trace(block, args)
            frame.finish()              # ``out`` holds what the call returns
            return out
        finally:
            self.frame = None

    def trace(self, block, args):
        """Run a child block's hooks and ``hybrid_forward`` with the recording ``F``."""
        outer_path = self.path
        self.path = outer_path + (block.name,)
        try:
            for hook in block._forward_pre_hooks.values():
                hook(block, args)
            _infer_own_shapes(block, args)
            dispatch.note_inputs(block, args)
            params = {name: self.param(p) for name, p in block._reg_params.items()}
            out = block.hybrid_forward(self.F, *args, **params)
            for hook in block._forward_hooks.values():
                hook(block, args, out)
            return out
        finally:
            self.path = outer_path

    def _reads_sparse(self, inputs):
        """Whether any of ``inputs`` (``(node, idx)`` pairs) is a leaf of a sparse
        array: the memo of call analyses, keyed by shapes and dtypes, does not
        know storage (a dense call of the same shape may be in it)."""
        leaves = self.graph.sparse_leaves
        return bool(leaves) and any(src in leaves for src, _ in inputs)

    def analyse_stub(self, op, args, kwargs, sources):
        """The CallInfo of ``op(*args, **kwargs)`` on stand-in inputs ``sources``.

        ``sources`` are ``(node, idx)`` pairs: graph values and leaves, or
        :class:`ops.Stand` objects (a shape and a dtype).  Frames and the
        template passes (``vectorize.py``) analyse their calls this way.
        """
        in_shapes = tuple([src.out_shapes[i] for src, i in sources])
        in_dtypes = tuple([src.out_dtypes[i] for src, i in sources])
        key, info = _memo(op, args, kwargs, in_shapes, in_dtypes)   # as ``add_node``
        sparse = self._reads_sparse(sources)
        if info is not None and not sparse:
            return info
        node = Node(self.graph, OP, op, list(sources), args, kwargs)
        node.sample, node.path = self.sample, self.path
        info = calls.analyse(node, in_shapes, in_dtypes)
        if not sparse:
            calls.remember(key, info)
        return info


def _rebase(lazy, result):
    """``lazy``, a frame's value updated in place to ``result``, is a reshape of
    what ``result`` reshapes (``bases.py``) or of nothing: not of its old base.
    The frame forgets the base at its next scan, as ``bases.note`` has it."""
    base = lazy._base = result._base
    frame = result._node
    if base is not None and type(frame) is Frame:
        if frame.based is None:
            frame.based = []
        frame.based.append(lazy)


def _memo(op, args, kwargs, in_shapes, in_dtypes):
    """``(key, CallInfo or None)`` of a call shape in the memo ``calls.INFOS``;
    ``(None, None)`` for a call with an unhashable constant argument."""
    try:
        key = (op, args, tuple(kwargs.items()) if kwargs else (), in_shapes, in_dtypes)
        return key, calls.INFOS.get(key)
    except TypeError:
        return None, None


def _on_cpu(array):
    """``array``, in shared CPU memory, as an array on the CPU: MXNet's operators
    take the two together, its CachedOps do not.  Recorded as a copy under
    autograd, so gradients reach ``array``."""
    return array.as_in_context(mx.cpu(array.context.device_id))


def _callers(task):
    """The ids of the tasks that started ``task`` (``gdb.map`` inside a sample),
    and theirs."""
    found = set()
    caller = task.parent
    while caller is not None:
        found.add(id(caller))
        caller = caller.parent
    return found


def summed_duplicates(csr):
    """``csr`` with the entries each row repeats for one column summed into one
    (and its row pointers, where MXNet left them out of an empty result).

    ``sparse.dot`` adds such entries (a word's subword ids, "aba": columns a,
    b, a); MXNet's conversions to dense, which gathering a sample's rows
    makes, keep only one of them.
    """
    indptr = csr.indptr.asnumpy()
    if len(indptr) != csr.shape[0] + 1:
        # MXNet's operators give a result of no entries (``tanh`` of an empty
        # CSR) without row pointers, which its kernels then read past (a
        # segfault once rows of several are gathered): an empty CSR made well.
        return mx.nd.sparse.zeros("csr", csr.shape, ctx=csr.context, dtype=csr.dtype)
    stored = int(indptr[-1])        # an operator's output may hold more room
    indices = csr.indices.asnumpy()[:stored]
    width = csr.shape[1]
    keys = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)) * width + indices
    unique, inverse = np.unique(keys, return_inverse=True)
    if len(unique) == len(keys):
        return csr
    summed = np.zeros(len(unique), dtype=csr.dtype)
    np.add.at(summed, inverse, csr.data.asnumpy()[:stored])
    rows, columns = np.divmod(unique, width)
    starts = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=csr.shape[0]))])
    return mx.nd.sparse.csr_matrix((summed, columns, starts), shape=csr.shape,
                                   ctx=csr.context, dtype=csr.dtype)


def pending_inputs(graph, args):
    """The inputs of a call whose arguments are all values of ``graph`` and none
    a parameter (``x + y``, ``F.tanh(x)``), else None."""
    inputs = []
    for a in args:
        if type(a) is not LazyArray:
            return None
        src = a._node
        if src is None or src.graph is not graph or src.param is not None:
            return None
        inputs.append((src, a._idx))
    return inputs


def _row_slice(rec, op, args, kwargs):
    """``F.slice_axis(x, axis=0, begin=i, end=j)``: a row view (``Recorder.row_slice``)."""
    if len(args) == 1 and len(kwargs) == 3 and kwargs.get("axis") == 0 \
            and "begin" in kwargs and "end" in kwargs and isinstance(args[0], NDArray):
        return rec.row_slice(args[0], kwargs["begin"], kwargs["end"])
    return None


def _row_concat(rec, op, args, kwargs):
    """``F.concat(*xs, dim=0)``: a row view (``RecorderCore.row_concat``); of values
    outside the recording frame, a view in the graph read by the frame as one input."""
    if len(kwargs) != 1 or kwargs.get("dim") != 0 or not args:
        return None
    out = rec.row_concat(op, args)
    if out is not None:
        return out
    frame = rec.frame
    if frame is None or not any(type(a) is LazyArray and a._node is frame for a in args):
        return rec.graph_op(op, args, kwargs)
    return None


# The recorder's own forms of calls as written (views), kept in faithful recordings.
_FORMS = {"slice_axis": _row_slice, "concat": _row_concat, "Concat": _row_concat}


def _moved_row_slice(begin, end, key):
    """The CallInfo of the row-slice view ``key`` (``Recorder._view_rows``) from one of
    the same width, trailing shape and dtype at other rows, or None.

    Where a view's rows start changes nothing but its constant arguments;
    literals of a sample's own length (``F.array(sentence)``) start at new rows
    in every batch, and would otherwise each pay a full analysis.
    """
    shape, dtype = key[3][0], key[4][0]
    known = _ROW_WIDTHS.get((end - begin, shape[1:], dtype))
    if known is None:
        return None
    return known.with_attrs(((), key[2]))


def _infer_own_shapes(block, args):
    """Finish the deferred initialisation of a block's parameters as its first
    eager call would, by MXNet's symbolic shape inference over the block.

    Calls whose operators tell their weights' shapes finish it as they are
    analysed; this is for blocks whose ``hybrid_forward`` first changes a
    weight of unknown shape (Gluon's fused RNN layers reshape theirs to one
    vector).  If inference fails, the calls are left to tell the shapes.
    """
    params = block._reg_params.values()  # pylint: disable=protected-access
    if not any(p._deferred_init for p in params):  # pylint: disable=protected-access
        return
    rec = context.TLS.recorder
    context.set_current(None)       # its symbolic trace calls its children: not recorded
    try:
        if type(block).infer_shape is gluon.HybridBlock.infer_shape:
            _infer_param_shapes(block, args)
        else:
            block.infer_shape(*args)
    except Exception:  # pylint: disable=broad-except
        return
    finally:
        context.set_current(rec)
    for param in params:
        # (A shape inference left partly unknown is left to the calls.)
        if param._deferred_init and all(d > 0 for d in param.shape):  # pylint: disable=W0212
            param._finish_deferred_init()  # pylint: disable=protected-access


def _infer_param_shapes(block, args):
    """``HybridBlock.infer_shape``: the shapes MXNet infers for ``block``'s
    parameters from its symbolic graph on arguments of ``args``' shapes,
    without Gluon's scan of the block's list attributes (``trie.parameters``)."""
    inputs, out = block._get_graph(*args)  # pylint: disable=protected-access
    flat = [a for a in gluon.block._flatten(args, "input")[0]  # pylint: disable=protected-access
            if a is not None]
    arg_shapes, _, aux_shapes = out.infer_shape(
        **{i.name: a.shape for i, a in zip(inputs, flat)})
    if arg_shapes is None:
        raise ValueError("shapes not inferred")
    shapes = dict(zip(out.list_arguments(), arg_shapes))
    shapes.update(zip(out.list_auxiliary_states(), aux_shapes))
    for param in trie.parameters(block):
        if param.name in shapes:
            param.shape = shapes[param.name]

