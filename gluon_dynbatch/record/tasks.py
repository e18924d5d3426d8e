"""Samples as resumable tasks: a sample that reads a value waits while the others record.

A model whose per-sample code reads a value decides its path by data
(``if float(score) > 0``, ``y = int(F.argmax(logits).asscalar())``, stop at
end-of-sentence).  Inside a batching scope, each top-level call of a
DynBatchBlock, and each call of the function given to ``gluon_dynbatch.map``,
runs as a *task* on a greenlet (a stack of its own, switched in the same
thread).  A read inside a task does not run what is pending: the task
*waits* and the scope goes on recording the other samples.  When every task
has finished or is waiting (the scope ends, or a result not finished yet is
used), the scope runs everything pending at once, batched across the
samples, and resumes each waiting task where it stopped, in the order they
started waiting.  So a scope flushes once per read in the longest chain of
reads of any one sample (plus once), not once per read.

Each task keeps what recording knows of its place (the frame recording, the
block path, the sample's number) and autograd's modes; switching tasks
swaps them.  A top-level call that waits returns a :class:`Pending` value,
filled in when its sample finishes.  An exception in a task is that sample's
error: the other tasks finish first.
"""
import collections
import contextvars
import dataclasses
import enum
import gc
import itertools
import math
import operator
import sys
import threading
import types
import warnings
import weakref

import greenlet
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.context import Context
from mxnet.base import integer_types, numeric_types
from mxnet.ndarray import NDArray
from mxnet.ndarray.sparse import BaseSparseNDArray

from ..ir.ops import opdef
from . import aliases
from .context import MODE_CHANGES
from .handlers import caught_at
from .lazy import LazyArray, shallow_copy
from ..errors import BatchingError, describe_call
from ..logs import warn_once

try:
    from mxnet.numpy import ndarray as _NP_NDARRAY
except ImportError:             # (a build of MXNet without its numpy interface)
    _NP_NDARRAY = None

_IDENTITY = opdef("identity")
_FORMS = weakref.WeakKeyDictionary()     # block -> {settings: the form of its calls' results}
_VARYING = "varying"                     # a block whose results change form


_DONE = object()    # what a worker switches back with when its task's call has ended


def _work():
    """A worker greenlet's loop: run each job ``(fn, args)`` left in ``_IDLE.job``,
    leave ``(result, error)`` in ``_IDLE.finished``, switch back with ``_DONE``,
    and wait for the next.  A greenlet's first switch costs ten times a switch
    to one already running (tens of microseconds a top-level call), so
    finished workers serve later tasks (``_IDLE.workers``).  Jobs and results
    pass outside the switches' arguments, which a suspended switch (or a
    greenlet's first call, for its whole life) keeps alive, and only a frame
    of the job's own holds it (``_run``): an idle worker holds nothing of its
    last task.  ``GreenletExit`` (``Tasks.close``)
    ends the worker."""
    while True:
        _IDLE.finished = _run()
        greenlet.getcurrent().parent.switch(_DONE)


def _run():
    """The job left for this worker, run; ``(result, error)``.  (Only this frame
    holds the job: an error's traceback keeps it, and through it the worker's
    own frame, which must hold nothing of later jobs.)"""
    (fn, args), _IDLE.job = _IDLE.job, None
    try:
        return fn(*args), None
    except greenlet.GreenletExit:
        raise
    except BaseException as err:  # pylint: disable=broad-except
        return None, err


class _Idle(threading.local):
    """Worker greenlets of this thread with no task (greenlets are per thread)."""

    def __init__(self):
        super().__init__()
        self.workers = []
        self.job = None         # (fn, args) of the task whose worker starts it now
        self.finished = None    # (result, error) of the task whose worker just ended it


_IDLE = _Idle()
_MAX_IDLE = 8
_MAX_THROWS = 16        # ``Tasks.close``'s throws into a sample that catches them


_ALL_IDLE = weakref.WeakSet()    # idle workers of every thread (``live_tasks``)


def _worker():
    """An idle worker greenlet of this thread, or a new one."""
    idle = _IDLE.workers
    while idle:
        glet = idle.pop()
        _ALL_IDLE.discard(glet)
        if not glet.dead:       # (one thrown into from outside ends)
            return glet
    return greenlet.greenlet(_work)


def _rest(glet):
    """Keep finished worker ``glet`` for a later task of its thread."""
    if len(_IDLE.workers) < _MAX_IDLE:
        _IDLE.workers.append(glet)
        _ALL_IDLE.add(glet)


def live_tasks():
    """Greenlets started and not finished, idle workers and threads' main
    greenlets aside: tasks of samples still waiting at a read (none once every
    scope has ended)."""
    idle = {id(glet) for glet in _ALL_IDLE}
    return sum(1 for obj in gc.get_objects() if isinstance(obj, greenlet.greenlet)
               and obj and obj.parent is not None and id(obj) not in idle)


class Task:
    """One sample's call running on a greenlet of its own (see the module docstring)."""

    __slots__ = ("glet", "job", "state", "result", "error", "done", "placeholders", "form",
                 "reads", "handed", "args", "sample", "blocked", "parent", "order", "scoped")

    def __init__(self, glet, job):
        self.glet = glet
        self.job = job              # ``(fn, args)`` until its first switch
        self.args = job[1] if job is not None else ()     # what it was given (``holding``)
        self.state = None           # recording state while it waits (``Tasks._state``)
        self.result = None
        self.error = None
        self.done = False
        self.placeholders = []      # what it handed out while it waited (``placeholders``)
        self.form = None            # the form of result they stand for
        self.reads = 0              # reads it waited at
        self.handed = None          # what the call returned while it waited
        self.sample = None          # the number of the sample it records (``call``)
        self.blocked = None         # the task whose result it waits for (``drain``)
        self.parent = None          # the task that started it (``gdb.map`` in a sample)
        self.order = ()             # its place in eager's order of samples (``Tasks.start``)
        self.scoped = None          # its own ``_scoped_state`` while it waits, if it changed it


class Tasks:
    """The tasks of one scope's recorder, and the rounds that run them."""

    def __init__(self, rec, flush):
        self.rec = rec
        self._flush = flush
        self.thread = threading.get_ident()     # the scope's: tasks switch on its stacks
        # Held while a task records and while a flush runs: a read from another
        # thread (a pool mapping over the results) flushes between those.
        self.lock = threading.RLock()
        self.current = None         # the task running now; None: the scope's own code
        self.waiting = []           # tasks waiting at a read, in the order they stopped
        self._given = (None, {}, None)  # the arrays they were given (``holding``)
        self.started = []           # every task of the scope not collected yet
        self.rounds = 0             # flushes run to resume waiting tasks
        self.longest = 0            # reads of the sample that read most
        self.mode = None            # the autograd modes of the tasks a round resumes now
        self._modes = (None, None)  # (MODE_CHANGES, autograd's modes) when last read
        self.variables = []         # (task, gradient array) of arrays samples attached grads to
        self.variable_ids = set()   # and those arrays' ids
        self._count = itertools.count()     # (``Task.order``)
        # Gradient arrays samples' code read (``x.grad``, the newest), which a
        # sample may clear before its own pass (``Recorder._gradients_among``).
        self.gradients_read = collections.deque(maxlen=256)
        self.cells = {}             # id -> (cell, its state's names): ``keep_cells``
        self._searched = set()      # ids of blocks whose children ``keep_cells`` searched
        self.restoring = False      # giving cells a task's state back (``_restore``)

    # -- running ------------------------------------------------------------------
    def start(self, fn, args):
        """``fn(*args)`` as a task, run until it finishes or waits; the task."""
        task = Task(_worker(), (fn, args))
        task.parent = self.current
        # Eager runs a sample's own samples (``gdb.map`` inside it) within it:
        # before the samples started after it, even those started earlier.
        task.order = (self.current.order if self.current is not None else ()) \
            + (next(self._count),)
        self.started.append(task)
        self._switch(task)
        return task

    def call(self, fn, args, owner, settings=(), site=None):
        """``fn(*args)``, a call of block ``owner`` with ``settings`` (see
        ``settings_of``) made by frame ``site``, as a task: its result if it
        finishes without waiting (or its error, at once); else, when an
        earlier call of ``owner`` with these settings showed the form of its
        results and the call is not inside a ``try`` of the caller's
        (``handlers``), placeholders of that form filled in when it finishes
        (``placeholders``); else its result once it has finished (the waiting
        samples go on meanwhile), or its error."""
        sample = self.rec.num_samples       # (the number the call's sample will take)
        self.keep_cells(owner)
        task = self.start(fn, args)
        task.sample = sample
        form = _FORMS.get(owner, {}).get(settings)
        if not task.done and form is not None and form is not _VARYING and (
                site is None or not caught_at(site, self.rec.entered)):
            task.form = (form, owner, settings)
            task.handed = placeholders(self, task, form)
            return task.handed
        if not task.done:
            if form is _VARYING:
                _tell_serial(owner)
            self.drain(task)
        self.started.remove(task)
        if task.error is not None:
            self._earlier_errors_first(task)
            raise task.error
        _note_form(owner, settings, form_of(task.result))
        return dense_results(self.rec, task.result)

    def _switch(self, task):
        """Run ``task`` until it finishes or waits, in its recording state."""
        with self.lock:
            self._switch_locked(task)

    def _switch_locked(self, task):
        outer, outer_task = self._state(), self.current
        entry = _scoped_state()
        self.current = task
        if task.state is not None:
            self._restore(task.state)
        else:       # its first call compares its modes with the pending calls' (``sync_mode``)
            self.rec._mode_seen = None  # pylint: disable=protected-access
            # A task ``gdb.map`` starts inside a sample records its own calls, not
            # into the frame of the caller's call (which a change of modes in the
            # task would end: its values then never settled).
            self.rec.frame = None
        if task.scoped is not None:
            _restore_scoped(task.scoped)
        # A wait returns to whoever runs the task now: the scope's rounds, or
        # the task that started it (``gluon_dynbatch.map`` inside a sample).
        glet = task.glet
        glet.parent = greenlet.getcurrent()
        try:
            if task.job is not None:
                # Each sample starts in a copy of its caller's context
                # variables, as an asyncio task does: it sees the caller's
                # values, and what it sets stays its own.
                glet.gr_context = contextvars.copy_context()
                _IDLE.job, task.job = task.job, None
            done = glet.switch()
            if done is _DONE:
                _rest(glet)
                (task.result, task.error), _IDLE.finished = _IDLE.finished, None
                task.done = True
                if task.error is None:
                    self._finished(task)
            elif glet.dead:             # (its worker was ended: ``close``)
                task.done = True
        except BaseException as err:  # pylint: disable=broad-except
            if isinstance(err, greenlet.GreenletExit):
                err = None
            task.done, task.error = True, err
        finally:
            if not task.done:
                task.state = self._state()
                _set_aside_scoped(task, entry)
            else:
                task.args = ()          # (a kept task keeps its sample's inputs no longer)
                task.scoped = None      # what a finished sample left stays, as eagerly
            self.current = outer_task
            self._restore(outer)

    def _earlier_errors_first(self, task):
        """``task`` failed: eager code ran the samples started before it to their
        end first, so those waiting now run on, and the first of them to fail
        raises its own error instead (in the scope's own code only)."""
        if self.current is not None:
            return
        earlier = sorted((t for t in self.started if not t.done and t.order < task.order),
                         key=lambda t: t.order)
        if not earlier:
            return
        self.drain()
        for other in earlier:
            if other.error is not None:
                self.started.remove(other)
                raise other.error

    def wait(self):
        """The running task waits for the next round (a value it reads is pending)."""
        task = self.current
        task.reads += 1
        self.waiting.append(task)
        task.glet.parent.switch()

    def holding(self, arrays):
        """Whether a waiting task was given one of ``arrays`` (in its arguments,
        or in lists, tuples and dicts of them), or an array sharing memory with
        one (a view of a buffer refilled per sample)."""
        waiting = self.waiting
        # Between rounds the scope's code only adds waiting tasks: the arrays
        # they were given are indexed once per round and count of tasks.
        key = (self.rounds, len(waiting), id(waiting[-1]) if waiting else None)
        if self._given[0] != key:
            given = []
            for task in waiting:
                _arrays_in(task.args, 4, given, objects=True)
            self._given = (key, {id(a): a for a in given}, aliases.memory_index(given))
        ids = self._given[1]
        return any(ids.get(id(a)) is a for a in arrays) \
            or any(aliases.in_index(a, self._given[2]) for a in arrays)

    def given_to_others(self, array, me, callers):
        """Whether a started task other than ``me`` and its ``callers`` (ids), not
        finished, was given ``array`` or an array sharing memory with it."""
        given = []
        for task in self.started:
            if task is not me and not task.done and id(task) not in callers:
                _arrays_in(task.args, 4, given)
        return any(a is array for a in given) or bool(given) and aliases.in_index(
            array, aliases.memory_index(given))

    def drain(self, until=None):
        """Rounds until every task has finished (or ``until`` has): each runs what
        is pending, then resumes the waiting tasks in the order they stopped."""
        if self.current is not None:        # a task uses a result not finished yet
            self.current.blocked = until
            try:
                while until is not None and not until.done:
                    self.wait()
            finally:
                self.current.blocked = None
            return
        try:
            while self.waiting and (until is None or not until.done):
                self.mode = self.rec.graph.mode or self.mode
                self._flush()
                self.rounds += 1
                resumed, self.waiting = self.waiting, []
                self._resume(resumed)
        finally:
            self.mode = None

    def _resume(self, resumed):
        """Resume the tasks of ``resumed`` whose calls ran under the round's
        autograd modes (a batch runs under one pair); the others wait on.

        A round keeps the modes of the calls it ran while a task waits under
        them, else takes those of the task waiting longest: samples that each
        pass through phases (encode, search under ``autograd.pause()``, score)
        run each phase together, one flush per read of its longest sample.  A
        task that changes its modes meanwhile waits (``Recorder.sync_mode``).
        A task waiting for another task's result is resumed once that has
        finished, and its modes choose no round's (the other task's may differ:
        it would never run).
        """
        ready = [task.blocked is None or task.blocked.done for task in resumed]
        modes = [task.state[9] for task in resumed]
        if self.mode not in [mode for mode, go in zip(modes, ready) if go]:
            self.mode = next((mode for mode, go in zip(modes, ready)
                              if go and mode is not None), None)
        later = []
        round_ = list(zip(resumed, modes, ready))
        for k, (task, mode, go) in enumerate(round_):
            if not (go and (mode is None or mode == self.mode)):
                later.append(task)
                continue
            try:
                self._switch(task)
            except BaseException:
                # (KeyboardInterrupt while the round resumes its tasks): those
                # not resumed yet wait on, so that the scope's end unwinds them.
                later.extend(t for t, _, _ in round_[k:] if not t.done
                             and not t.glet.dead and t not in self.waiting)
                self.waiting[:0] = later
                raise
        self.waiting[:0] = later        # they stopped before those stopping now

    def _finished(self, task):
        self.longest = max(self.longest, task.reads)
        if task.form is None:
            return
        try:
            if form_of(task.result) != task.form[0]:
                _refit(task)
            for holder in task.placeholders:
                holder.fill(_part(task.result, holder._path))  # pylint: disable=W0212
        except BatchingError as err:
            task.error = err

    def raise_first_error(self):
        """Raise the first error of a finished task (every task has finished)."""
        for task in self.started:
            if task.error is not None:
                self.started = []
                raise task.error
        self.started = []

    def close(self, why):
        """Unwind every task still waiting: the scope ends early, because of ``why``."""
        waiting, self.waiting = self.waiting, []
        for task in waiting:
            outer, entry = self._state(), _scoped_state()
            if task.scoped is not None:             # its with-blocks unwind from its own
                _restore_scoped(task.scoped)
            try:
                # A sample whose code catches every exception (a bare ``except:``
                # around a read) goes on to its next read or its end: thrown into
                # again until its worker ends.
                for _ in range(_MAX_THROWS):
                    try:
                        task.glet.throw()
                    except greenlet.GreenletExit:
                        pass
                    if task.glet.dead:
                        break
            finally:
                self._restore(outer)
                _restore_scoped(entry)
            task.done, task.args = True, ()
            task.error = BatchingError(
                "this sample was waiting at a read when its batching scope ended (%s); "
                "record it again in a new scope" % why)
        self.started = []
        self.current = None
        self._given = (None, {}, None)

    # -- what a task's recording is -----------------------------------------------
    def keep_cells(self, block):
        """Make the state of ``block``, and of the blocks below it, that Gluon's
        stateful cells (``CELL_STATES``) keep between calls each task's own."""
        if id(block) in self._searched:
            return
        self._searched.add(id(block))
        names = _cell_state_names(block)
        if names:
            self.cells[id(block)] = (block, names)
        for child in getattr(block, "_children", {}).values():
            self.keep_cells(child() if isinstance(child, weakref.ref) else child)

    def _state(self):
        rec = self.rec
        recording, training = self._autograd_modes()
        # The streams too: a sample printing inside ``redirect_stdout`` prints
        # into its own buffer, whatever the others do meanwhile.  And the
        # stateful cells' state: a sample's decoder step must not see another
        # sample's masks or previous output.
        cells = tuple((cell, tuple([getattr(cell, name) for name in names]))
                      for cell, names in self.cells.values()) if self.cells else ()
        return (rec.frame, rec.depth, rec.path, rec.sample, recording, training,
                sys.gettrace(), sys.stdout, sys.stderr, rec.mode, cells, rec.innermost)

    def _autograd_modes(self):
        """Autograd's (recording, training), read from MXNet only when a mode may
        have changed since the last read (``context.MODE_CHANGES``): two ctypes
        calls per task switch would cost more than the switch."""
        seen, modes = self._modes
        if seen != MODE_CHANGES[0]:
            modes = (autograd.is_recording(), autograd.is_training())
            self._modes = (MODE_CHANGES[0], modes)
        return modes

    def _restore(self, state):
        rec = self.rec
        rec.frame, rec.depth, rec.path, rec.sample = state[:4]
        rec.innermost = state[11]
        recording, training = self._autograd_modes()
        if recording != state[4]:
            autograd.set_recording(state[4])
        if training != state[5]:
            autograd.set_training(state[5])
        if sys.gettrace() is not state[6]:
            sys.settrace(state[6])
        sys.stdout, sys.stderr = state[7], state[8]
        self.restoring = True           # (no wait for the samples: ``dispatch._watching_setattr``)
        try:
            for cell, values in state[10]:
                for name, value in zip(self.cells[id(cell)][1], values):
                    setattr(cell, name, value)
        finally:
            self.restoring = False
        # The modes the task's calls were recorded under (None: it recorded
        # nothing yet) are its own: where another task left other ones, or
        # pending calls of other modes, its next call reads autograd's modes
        # again (``Recorder.sync_mode``), and waits if the pending calls'
        # modes are not its own.
        mode, pending = state[9], rec.graph.mode
        if mode is not None and (rec.mode != mode or pending is not None and pending != mode):
            rec.mode = mode
            rec._mode_seen = None       # pylint: disable=protected-access


_DEFAULT_CONTEXT = Context._default_ctx     # (MXNet's, per thread: ``with mx.cpu(1):``)


def _scoped_state():
    """What ``with`` blocks a sample may wait inside set: MXNet's default context
    (``with ctx:``), numpy's error handling (``np.errstate``), the warning
    filters and handlers (``warnings.catch_warnings``).  Each block saves the
    value it found and puts it back on exit, so a sample resumed in another's
    would leave that one set, after the scope too: what a sample changed is
    its own while it waits (``_set_aside_scoped``)."""
    # (A copy: ``np.seterr`` changes the list ``np.geterrobj`` returns in place.)
    return (getattr(_DEFAULT_CONTEXT, "value", None), tuple(np.geterrobj()), warnings.filters,
            warnings.showwarning, getattr(warnings, "_showwarnmsg_impl", None))


def _set_aside_scoped(task, entry):
    """``task`` waits: if it changed the ``_scoped_state`` it was resumed in (or
    had its own already), keep its state for its next turn and put back
    ``entry``, what the code that resumed it had; else leave everything as it
    is (the warning filters are the process's: another thread may have
    changed them meanwhile)."""
    now = _scoped_state()
    unchanged = now[0] is entry[0] and now[1] == entry[1] \
        and all(a is b for a, b in zip(now[2:], entry[2:]))
    if task.scoped is None and unchanged:
        return
    task.scoped = now
    _restore_scoped(entry)


def _restore_scoped(state):
    """Put back what ``_scoped_state`` gave, where it differs (cheap checks)."""
    ctx, errobj, filters, show, show_impl = state
    if getattr(_DEFAULT_CONTEXT, "value", None) is not ctx:
        if ctx is None:
            del _DEFAULT_CONTEXT.value
        else:
            _DEFAULT_CONTEXT.value = ctx
    if tuple(np.geterrobj()) != errobj:
        np.seterrobj(list(errobj))
    if warnings.filters is not filters:
        warnings.filters = filters
        warnings._filters_mutated()     # pylint: disable=protected-access
    if warnings.showwarning is not show:
        warnings.showwarning = show
    if show_impl is not None and getattr(warnings, "_showwarnmsg_impl", None) is not show_impl:
        warnings._showwarnmsg_impl = show_impl  # pylint: disable=protected-access


def form_of(result):
    """The form of a call's result: ``"array"``, ``"none"``, ``"values"`` (a list
    of values only, such as the tokens a decoder chose, whose length varies from
    sample to sample), ``"value"`` (anything else), or ``(container type, item
    forms[, keys])`` of a tuple, list, named tuple, dict or OrderedDict, or
    ``(dataclass, field forms, field names, "fields")``."""
    if isinstance(result, NDArray):
        return "array"
    if result is None:
        return "none"
    if type(result) is list:
        items = tuple(form_of(item) for item in result)
        return "values" if all(item in ("value", "values", "none") for item in items) \
            else (list, items)
    if type(result) in _DICTS:
        return (type(result), tuple(form_of(v) for v in result.values()), tuple(result))
    if isinstance(result, (tuple, list)) and type(result) in (tuple, list) \
            or hasattr(type(result), "_make"):
        return (type(result), tuple(form_of(item) for item in result))
    names = _record_fields(result)
    if names is not None:
        return (type(result), tuple(form_of(getattr(result, n)) for n in names), names,
                "fields")
    return "value"


_DICTS = (dict, collections.OrderedDict)


def _record_fields(result):
    """The field names of a dataclass instance made by its ``__init__`` from
    its fields alone (a record of values), else None."""
    if not dataclasses.is_dataclass(result) or isinstance(result, type):
        return None
    fields = dataclasses.fields(result)
    if not all(f.init for f in fields):
        return None
    return tuple(f.name for f in fields)


def placeholders(tasks, task, form, path=()):
    """What a waiting call returns: its result's form (learned from an earlier
    call of the block) made of :class:`Pending` arrays and :class:`PendingValue`
    values, each filled in from its place (``path``) when the sample finishes."""
    if form == "array":
        found = Pending(tasks, task, path)
    elif form == "values":
        found = PendingList(tasks, task, path)
    elif form == "value":
        found = PendingValue(tasks, task, path)
    elif form == "none":
        return None
    else:
        items = [placeholders(tasks, task, item, path + (k,))
                 for k, item in enumerate(form[1])]
        kind = form[0]
        if kind in _DICTS:
            return kind(zip(form[2], items))
        if len(form) == 4:              # a dataclass, by its fields
            try:
                return kind(**dict(zip(form[2], items)))
            except Exception:  # pylint: disable=broad-except  (its own checks refuse them)
                found = PendingValue(tasks, task, path)
                task.placeholders.append(found)
                return found
        if kind is list:
            return PendingItems(tasks, task, items)
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    task.placeholders.append(found)
    return found


def _arrays_in(obj, depth, found, objects=False, inside=False):
    """Append to ``found`` the NDArrays ``obj`` is or holds within ``depth``
    levels of lists, tuples and dicts, and with ``objects`` of the attributes
    of plain objects too (an example object holding a sample's arrays; lists
    of more than ``_MOST_ITEMS`` there, ``inside`` one, are not searched).  A
    waiting sample's stand-in list gives what it holds now: looking does not
    run its sample."""
    if isinstance(obj, NDArray):
        found.append(obj)
    elif not depth:
        return
    elif isinstance(obj, _WaitingList):
        for item in list.__iter__(obj):
            _arrays_in(item, depth - 1, found, objects, inside)
    elif isinstance(obj, (list, tuple, dict)):
        if inside and len(obj) > _MOST_ITEMS:
            return          # (a vocabulary an example refers to, not a sample's arrays)
        for item in obj.values() if isinstance(obj, dict) else obj:
            _arrays_in(item, depth - 1, found, objects, inside)
    elif objects and not str(type(obj).__module__).startswith(_LIBRARIES) \
            and not isinstance(obj, _NOT_SEARCHED):
        try:        # (not through ``__getattr__``: a proxy's would run something)
            attributes = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            return
        if type(attributes) is dict:
            for item in list(attributes.values()):
                _arrays_in(item, depth - 1, found, objects, True)


# Objects whose attributes are not a sample's data: this library's own (a
# recorder, a waiting sample's stand-ins), MXNet's and Python's, blocks (their
# parameters are known as weights), classes, modules, functions.
_LIBRARIES = ("gluon_dynbatch", "mxnet", "numpy", "builtins", "greenlet", "gluonnlp")
_NOT_SEARCHED = (gluon.Block, type, types.ModuleType, types.FunctionType, types.MethodType)
_MOST_ITEMS = 1000      # items of a list or dict searched for a waiting sample's arrays


def settings_of(args, owner=None):
    """The number of arguments of a call and those that look like settings
    (strings, booleans, None, members of an ``enum.Enum``), by position: the
    forms of a block's results are learned per settings, as a mode
    (``model(x, "beam")``, ``model(x, Mode.DECODE)``, or a target left out:
    ``model(x)`` against ``model(x, gold)``) may change what its calls return.
    Integers count too for a block ``owner`` whose results changed form under
    the same settings (``model(x, k)`` returning ``k`` arrays)."""
    counted = _INT_SETTINGS if owner is not None and owner in _BY_INTEGERS else _SETTINGS
    return (len(args),) + tuple((k, a) for k, a in enumerate(args)
                                if a is None or type(a) in counted
                                or isinstance(a, enum.Enum))


_SETTINGS = (str, bool)
_INT_SETTINGS = (str, bool, int)
_BY_INTEGERS = weakref.WeakSet()    # blocks whose results' forms are learned per integers


def _note_form(owner, settings, form):
    """Remember the form of a result of block ``owner``'s calls with ``settings``;
    calls whose results change form are never given placeholders again, but
    for lists of other lengths and dicts of other values (``_refit`` fits them)."""
    forms = _FORMS.get(owner)
    if forms is None:
        forms = _FORMS[owner] = {}
    known = forms.get(settings)
    if known is None or known == form:
        forms[settings] = form
    elif not _compatible(known, form):
        forms[settings] = _VARYING


CELL_STATES = ((gluon.rnn.ZoneoutCell, ("_prev_output",)),
               (gluon.contrib.rnn.VariationalDropoutCell,
                ("drop_inputs_mask", "drop_states_mask", "drop_outputs_mask")))
"""Gluon's cells that keep state between calls until ``reset()``, and its names."""


def _cell_state_names(block):
    """The names of the state ``block`` keeps between calls (``CELL_STATES``)."""
    return tuple(name for cls, names in CELL_STATES if isinstance(block, cls)
                 for name in names)


def _tell_serial(owner):
    """Warn, once per block, that its calls waiting at reads run one at a time."""
    warn_once(("serial", id(owner)),
              "%s: its results change form from call to call, so a call that waits "
              "at a read runs to its end before the loop goes on: such samples are "
              "not batched across their reads; run them with gluon_dynbatch.map(), "
              "or return a list instead of tuples", type(owner).__name__)


def _refit(task):
    """Fit what a waiting call handed out to its result, of another form than
    the one learned from earlier calls (a decoder's list of per-step outputs,
    one per token it chose: as long as its sample's sentence).

    Lists handed out take the result's items, at any depth (an item of the
    form it was handed in keeps its stand-ins), and dicts of the same keys
    their values; stand-ins at places of the result of their kind stand for
    what is there, and those at places it lacks raise where used, as indexing
    the result would.  Tuples, other keys or another type cannot be refitted:
    BatchingError, after which the block's results are given no stand-ins of
    that form again (and are learned per integer argument, ``settings_of``).
    """
    handed, result = task.handed, task.result
    form, owner, settings = task.form
    if not _refittable(handed, result, form):
        _note_form(owner, settings, form_of(result))
        _BY_INTEGERS.add(owner)
        _form_error(result, task.sample, owner)
    _fit(handed, result, form)
    kept = []
    for holder in task.placeholders:
        try:
            part = _part(result, holder._path)  # pylint: disable=protected-access
        except (IndexError, KeyError, AttributeError, TypeError):
            part = _MISSING
        if _fits(holder, part):
            kept.append(holder)
        else:
            holder._task = _gone(holder._path)  # pylint: disable=protected-access
    task.placeholders = kept


def _compatible(known, form):
    """Whether results of ``form`` can be fitted into what is handed out in
    form ``known`` (``_refit``): the same, or containers that take them."""
    if known == form:
        return True
    if known == "values":               # a list of values handed out takes any list
        return type(form) is tuple and form[0] is list
    if type(known) is not tuple or known[0] is not list and type(form) is not tuple:
        return False
    if known[0] is list:
        return form == "values" or type(form) is tuple and form[0] is list
    if known[0] is not form[0] or len(known) != len(form) or known[2:] != form[2:]:
        return False
    if known[0] in _DICTS:              # the same keys: values are replaced
        return True
    return len(known[1]) == len(form[1]) and all(map(_compatible, known[1], form[1]))


def _refittable(handed, result, form):
    """Whether ``handed``, made in ``form``, can take ``result`` in place."""
    if form == "values":                # a PendingList: it takes the result's items
        return type(handed) is PendingList and type(result) is list
    if not _compatible(form, form_of(result)):
        return False
    if form_of(result) == form:
        return True
    kind = form[0]
    if kind is list:                    # a PendingItems
        return isinstance(handed, list) and type(result) is list
    if type(handed) is not kind or type(result) is not kind:
        return False
    if kind in _DICTS:
        return True
    return all(_refittable(h, r, f) for h, r, f in zip(_children(handed, form),
                                                        _children(result, form), form[1]))


def _children(container, form):
    """The items of a container of ``form`` (``form_of``), in order."""
    if form[0] in _DICTS:
        return list(container.values())
    if len(form) == 4:                  # a dataclass
        return [getattr(container, name) for name in form[2]]
    return list(container)


def _fit(handed, result, form):
    """Put ``result``'s items into ``handed`` (checked by ``_refittable``)."""
    if form == "values" or form_of(result) == form:
        return                          # (a PendingList takes its items when filled)
    kind = form[0]
    if kind is list:
        items = []
        for k, item in enumerate(result):
            if k < len(form[1]) and k < len(handed) and _refittable(handed[k], item, form[1][k]):
                _fit(handed[k], item, form[1][k])
                items.append(handed[k])
            else:
                items.append(item)
        list.__setitem__(handed, slice(None), items)
        return
    for k, (h, r, f) in enumerate(zip(_children(handed, form), _children(result, form),
                                      form[1])):
        if _refittable(h, r, f):
            _fit(h, r, f)
        elif kind in _DICTS:
            handed[form[2][k]] = r


_MISSING = object()


def _fits(holder, part):
    """Whether stand-in ``holder`` can stand for ``part`` of a result."""
    if part is _MISSING:
        return False
    if isinstance(holder, Pending):
        return isinstance(part, NDArray)
    if isinstance(holder, PendingList):
        return type(part) is list
    return not isinstance(part, NDArray)


def _gone(path):
    """A finished task whose error says a stand-in's place is not in its result."""
    task = Task(None, None)
    task.done = True
    task.error = BatchingError(
        "a sample's result has nothing of this kind at %s (a stand-in handed out while the "
        "sample waited, in the form of an earlier call's result); eager code indexing the "
        "result there would raise too" % (list(path),))
    return task


def _form_error(result, sample, owner):
    """Raise: a waiting call's result is not of the form of its stand-ins."""
    raise BatchingError(
        "%s: the call returned %r where an earlier call of its block with the same "
        "settings (its string, boolean, None and enum arguments; in this scope or an earlier one) "
        "returned a result of another form, and the call was handed that form's stand-ins "
        "while its sample waited at a read (only a list can be refitted). From now on the "
        "forms of this block's results are learned per integer argument too; where they "
        "depend on anything else, run such samples with gluon_dynbatch.map, which hands out "
        "each result once its sample has finished"
        % (describe_call(sample, (owner.name,)), form_of(result)))


def _part(result, path):
    """The part of ``result`` at ``path``."""
    for key in path:
        if isinstance(result, dict):
            result = result[list(result)[key]]
        elif isinstance(result, (tuple, list)):
            result = result[key]
        else:                           # a dataclass (``form_of``)
            result = getattr(result, _record_fields(result)[key])
    return result


def dense_results(rec, result):
    """A sample's result with each value of sparse storage (run by itself,
    ``alone.run_alone``) given as a dense array of its values, as placeholders
    hold them (``Pending.fill``): a LazyArray is a dense array."""
    if isinstance(result, (list, tuple)):
        items = [dense_results(rec, item) for item in result]
        if all(a is b for a, b in zip(items, result)):
            return result
        return type(result)(*items) if hasattr(result, "_fields") else type(result)(items)
    if isinstance(result, dict):
        items = {k: dense_results(rec, v) for k, v in result.items()}
        return result if all(items[k] is result[k] for k in result) else type(result)(items)
    sparse = sparse_array(result)
    if sparse is not None:
        return rec.wrap_inputs(nd.cast_storage(sparse, stype="default"))
    return result


def sparse_array(value):
    """The array of sparse storage ``value`` is, or stands for as a leaf of a
    graph (a result computed by itself, ``alone.run_alone``); else None.
    Nothing pending is computed to tell."""
    if type(value) is LazyArray:
        node = value._node
        value = node.value if node is not None and node.kind == "leaf" else None
    return value if isinstance(value, BaseSparseNDArray) else None


class Pending(LazyArray):
    """An array a top-level call returns while its sample waits at a read.

    It stands for the array at its place in the call's result once the
    sample finishes (an identity of it, recorded, so gradients flow).  Using
    it before then (its shape, its values) runs the rounds its sample needs
    first.
    """

    __slots__ = ("_tasks", "_task", "_path")

    def __init__(self, tasks=None, task=None, path=None, handle=None, writable=True):
        # ``handle``: NDArray methods that make a view of a computed value
        # (``reshape``, basic indexing) call ``self.__class__(handle=...)``.
        super().__init__(None, 0, handle=handle, writable=writable)
        self._tasks, self._task, self._path = tasks, task, path

    def fill(self, value):
        """Stand for ``value``, the array at this place of the sample's result."""
        if not isinstance(value, NDArray):
            raise BatchingError("a sample's call returned %r where an array was expected"
                                % (type(value).__name__,))
        if _NP_NDARRAY is not None and isinstance(value, _NP_NDARRAY):
            raise BatchingError(
                "%s returned an mx.np array (numpy semantics), which the placeholder the "
                "call returned inside the scope (a legacy NDArray) cannot stand for; "
                "run the samples with gdb.map(model, samples), which returns each "
                "sample's result as it is, or return legacy arrays (x.as_nd_ndarray())"
                % describe_call(self._task.sample if self._task is not None else None,
                                self._path or ()))
        sparse = sparse_array(value)
        if sparse is not None:
            # This placeholder is a dense array: it holds the value densely.
            self._set_result(nd.cast_storage(sparse, stype="default"))
        elif _is_variable(value):
            # A variable of autograd (``e.attach_grad()`` on a value the sample
            # returns): the placeholder shares its array and its gradient, as
            # the caller's handle of eager's result was the variable itself.
            self._set_result(shallow_copy(value))
        elif isinstance(value, LazyArray) and value._node is not None:
            # A copy of its own: a call on weights alone is one node for every
            # sample (``weights.shared_call``), which each placeholder would take.
            out = self._tasks.rec.own_copy(value)
            node, idx = out._node, out._idx
            out._node = None
            self._node, self._idx = node, idx
            node.outs[idx] = weakref.ref(self)
        else:
            self._set_result(nd.identity(value))

    def settled_node(self):
        """Its graph node once its sample has finished (running the rounds it needs),
        None if its value was computed: the recorder reads a waiting sample's
        result as the value its sample records, never as a concrete input the
        graph itself would compute."""
        _force(self._tasks, self._task)
        return self._node

    def result(self):
        """The sample's whole result, once it has finished (running what it needs)."""
        _force(self._tasks, self._task)
        return self._task.result

    @property
    def shape(self):
        _force(self._tasks, self._task)
        return LazyArray.shape.fget(self)

    @property
    def dtype(self):
        _force(self._tasks, self._task)
        return LazyArray.dtype.fget(self)

    @property
    def context(self):
        _force(self._tasks, self._task)
        return LazyArray.context.fget(self)

    ctx = context

    def _materialize(self):
        _force(self._tasks, self._task)
        return LazyArray._materialize(self)  # pylint: disable=protected-access

    def __repr__(self):
        if self._task is not None and not self._task.done:
            return "<Pending array of a sample waiting at a read>"
        return LazyArray.__repr__(self)


def _is_variable(value):
    """Whether ``value``, a sample's result, is an array of its own with a gradient
    attached (not a pending value, nor rows of a batched output)."""
    if isinstance(value, LazyArray) and (value._h is None or value._node is not None
                                         or value._rows is not None):
        return False
    return NDArray.grad.fget(value) is not None


def _on_value(fn, reflected=False):
    """A method of :class:`PendingValue` applying ``fn`` to its value (and the
    other operand, on its left when ``reflected``)."""
    if reflected:
        def method(self, other):
            return fn(other, self.value())
    else:
        def method(self, *args):
            return fn(self.value(), *args)
    method.__name__ = getattr(fn, "__name__", "method")
    return method


class PendingValue:
    """A value (not an array) a top-level call returns while its sample waits:
    using it runs the rounds its sample needs, then acts as the value (a
    number in arithmetic, comparisons, ``round``, ``format``, ``hash``,
    numpy); ``value()`` or ``float(x)`` gives the value itself."""

    __slots__ = ("_tasks", "_task", "_path", "_value")

    def __init__(self, tasks, task, path):
        self._tasks, self._task, self._path, self._value = tasks, task, path, None

    def fill(self, value):
        """Stand for ``value`` (the sample finished: its task is let go)."""
        self._value = value
        self._tasks = self._task = None

    def value(self):
        """The value, once the sample has finished."""
        _force(self._tasks, self._task)
        return self._value

    def __reduce__(self):
        # Pickled (and so copied between processes) as the value itself.
        return _same, (self.value(),)

    def __getattr__(self, name):
        return getattr(self.value(), name)

    def __setattr__(self, name, value):
        if name in PendingValue.__slots__:
            object.__setattr__(self, name, value)
        else:                           # the value's own (a node's ``.name = ...``)
            setattr(self.value(), name, value)

    def __delattr__(self, name):
        delattr(self.value(), name)

    def __setitem__(self, key, item):
        self.value()[key] = item        # a numpy array's, a dict's

    def __delitem__(self, key):
        del self.value()[key]

    def __repr__(self):
        # As the value's: MXNet writes tuple attributes (``nd.ones((k,))``) by repr.
        return repr(self.value())

    def __array__(self, dtype=None):
        return np.asarray(self.value(), dtype=dtype)

    for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                  "and", "or", "xor", "lshift", "rshift"):
        _fn = getattr(operator, "__%s__" % _name)
        locals()["__%s__" % _name] = _on_value(_fn)
        locals()["__r%s__" % _name] = _on_value(_fn, reflected=True)
    for _name in ("eq", "ne", "lt", "le", "gt", "ge", "neg", "pos", "abs", "invert",
                  "index", "getitem", "contains"):
        locals()["__%s__" % _name] = _on_value(getattr(operator, "__%s__" % _name))
    for _name, _fn in (("bool", bool), ("int", int), ("float", float), ("complex", complex),
                       ("str", str), ("hash", hash), ("len", len), ("iter", iter),
                       ("format", format), ("round", round), ("divmod", divmod),
                       ("trunc", math.trunc), ("floor", math.floor), ("ceil", math.ceil)):
        locals()["__%s__" % _name] = _on_value(_fn)
    __rdivmod__ = _on_value(divmod, reflected=True)
    del _name, _fn


def _same(value):
    """``value`` (what a pickled :class:`PendingValue` loads as)."""
    return value


class _StandIn(type):
    """``isinstance(x, cls)`` holds for a :class:`PendingValue` whose value is one
    of ``cls.kinds``: MXNet's NDArray tells numbers and indices apart so."""

    def __instancecheck__(cls, value):
        return type(value) is PendingValue and isinstance(value.value(), cls.kinds)


class PendingNumber(metaclass=_StandIn):
    """A waiting sample's number, as ``NDArray`` arithmetic checks numbers."""

    kinds = numeric_types


class PendingInteger(metaclass=_StandIn):
    """A waiting sample's integer, as ``NDArray`` indexing checks integers."""

    kinds = integer_types


NUMBERS = numeric_types + (PendingNumber,)


def install():
    """Let ``NDArray`` take a :class:`PendingValue` as the number or the index it
    stands for (``h * f``, ``h[:, k]``), as it takes the value itself."""
    from mxnet.ndarray import ndarray as module     # pylint: disable=import-outside-toplevel
    module.numeric_types = NUMBERS
    module.integer_types = integer_types + (PendingInteger,)


def _forcing(name):
    """``list.<name>``, once the list's sample has finished (``PendingList``)."""
    method = getattr(list, name)

    def forced(self, *args):
        _force(self._tasks, self._task)     # pylint: disable=protected-access
        return method(self, *args)
    forced.__name__ = name
    return forced


# What reads a stand-in list's items or length, or changes it: run its sample first.
_LIST_READS = ("__len__", "__iter__", "__reversed__", "__getitem__", "__contains__", "__eq__",
               "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__",
               "__rmul__", "__repr__", "__str__", "count", "index", "copy", "__setitem__",
               "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "pop",
               "remove", "reverse", "sort", "clear")


class _WaitingList(list):
    """A list a top-level call returns while its sample waits: reading or
    changing it first runs the rounds its sample needs."""

    __slots__ = ("_tasks", "_task")

    for _name in _LIST_READS:
        locals()[_name] = _forcing(_name)
    del _name
    __hash__ = None

    def __radd__(self, other):
        """``[bos] + tokens``: list's own concatenation copies the items the
        right operand holds (none yet); Python asks a subclass first."""
        if not isinstance(other, list):
            return NotImplemented
        _force(self._tasks, self._task)
        return other + list.__getitem__(self, slice(None))

    def __reduce_ex__(self, protocol):
        """Pickled and copied as the plain list of its items."""
        _force(self._tasks, self._task)
        return (list, (list.__getitem__(self, slice(None)),))


class PendingList(_WaitingList):
    """A list of values (a decoder's tokens) a top-level call returns while its
    sample waits: a list, empty until the sample finishes, when it takes the
    values; reading it earlier runs the rounds its sample needs first."""

    __slots__ = ("_path",)

    def __init__(self, tasks, task, path):
        super().__init__()
        self._tasks, self._task, self._path = tasks, task, path

    def fill(self, value):
        """Hold the values of ``value``."""
        list.__setitem__(self, slice(None), value)


class PendingItems(_WaitingList):
    """A list of arrays (a decoder's outputs, one per step) a top-level call
    returns while its sample waits: stand-ins in the form of earlier calls'
    results, fitted to the sample's own result when it finishes (``_refit``).

    Its length is the sample's own: reading the length, iterating, indexing
    from the end or past the stand-ins, comparing or changing it first runs
    the rounds its sample needs; an item indexed among the stand-ins does not
    (it raises where used if the sample's result has no such item).
    """

    __slots__ = ()

    def __init__(self, tasks, task, items):
        super().__init__(items)
        self._tasks, self._task = tasks, task

    def __getitem__(self, index):
        if type(index) is not int or not 0 <= index < list.__len__(self):
            _force(self._tasks, self._task)
        return list.__getitem__(self, index)


def _force(tasks, task):
    if task is None:            # a view of a filled-in value (``Pending.__init__``)
        return
    if not task.done:
        if threading.get_ident() != tasks.thread:
            # Greenlets switch within their thread, and the scope's thread may
            # well be waiting for this one (a pool mapping over the results).
            raise BatchingError(
                "a result of a sample still waiting at a read is used in another thread "
                "than its batching scope's: use it in the scope's thread, or after the "
                "scope has ended")
        tasks.drain(task)
    if task.error is not None:
        raise task.error
