"""The batching scope: records calls while open, plans and runs them at flush."""
import gc
import itertools
import logging
import math
import numbers
import os
import sys
import threading
import time

try:
    import resource
except ImportError:             # (Windows)
    resource = None

import mxnet as mx

from .errors import BatchingError
from .logs import warn_once
from .plan import budget, scalars, sums
from .plan.planners import PLANNERS, make_plan
from .record import context, dispatch, handlers, literals, patches, trie
from .record.tasks import dense_results
from .record.recorder import Recorder
from .run.cache import PlanCache
from .run.executors import run_compiled, run_interpreted, run_steps
from .run.reference import run_reference
from .stats import BatchStats
from .templates.recipes import recipe_for

log = logging.getLogger(__name__)

#: Growth of the process's resident size after which a flush runs the cyclic
#: garbage collector that open scopes pause (``_OpenScopes``).
COLLECT_AFTER_KB = 1 << 20
#: Seconds between two reads of the process's size by ``collect_if_grown``.
CHECK_SIZE_EVERY_S = 0.05


def _resident_kb():
    """The process's resident size in kB, where the platform tells it (Linux's
    ``/proc``), else its peak (``resource``), else 0."""
    try:
        with open("/proc/self/statm", "rb") as stats:
            return int(stats.read().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if resource else 0


_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


class _OpenScopes:
    """What holds while any scope is open, process-wide (scopes are counted
    across threads): Python's cyclic garbage collector paused, and block calls
    recorded (``dispatch.attach_call``).

    Recording allocates many small linked objects; full collections triggered
    by them cost several times the recording itself.  Garbage with reference
    cycles that samples make (a search's tree nodes linked to their parents)
    then stays until the last scope ends: once the process has grown by
    ``COLLECT_AFTER_KB`` since the pause began or its last collection, a flush
    collects it (``collect_if_grown``).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._open = {}             # thread id -> scopes it has open
        self._attached = False
        self._was_enabled = False
        self._size_kb = 0           # the process's size at the pause or the last collection
        self._checked = -math.inf   # when ``collect_if_grown`` last read the size

    def enter(self):
        """Count a scope the calling thread opens; returns the thread's id, for ``leave``."""
        with self._lock:
            if not self._attached:
                self._was_enabled = gc.isenabled()
                gc.disable()
                self._size_kb = _resident_kb()
                dispatch.attach_call()
                self._attached = True
            ident = threading.get_ident()
            self._open[ident] = self._open.get(ident, 0) + 1
            return ident

    def leave(self, ident):
        """A scope thread ``ident`` opened ends (maybe in another thread: a
        generator's scope closed by its consumer)."""
        with self._lock:
            count = self._open.get(ident, 0) - 1
            if count > 0:
                self._open[ident] = count
            else:
                self._open.pop(ident, None)     # (gone in a forked child)
                self._release_when_none_open()

    def collect_if_grown(self):
        """Run the cyclic collector if the process grew by ``COLLECT_AFTER_KB``
        since the pause began or the last such collection (asked at most every
        ``CHECK_SIZE_EVERY_S``: a scope whose samples read flushes per read)."""
        now = time.perf_counter()
        if now - self._checked < CHECK_SIZE_EVERY_S:
            return
        self._checked = now
        size = _resident_kb()
        if size - self._size_kb > COLLECT_AFTER_KB:
            found = gc.collect()
            self._size_kb = _resident_kb()
            log.debug("the process grew to %d kB while scopes were open: %d objects "
                      "collected, %d kB now", size, found, self._size_kb)

    def _release_when_none_open(self):
        if not self._open and self._attached:
            self._attached = False
            dispatch.detach_call()
            if self._was_enabled:
                gc.enable()

    def after_fork(self):
        """In a child process: only the forking thread lives on, with its own
        scopes; other threads' scopes are gone (and so is anything they held)."""
        self._lock = threading.Lock()
        ident = threading.get_ident()
        self._open = {ident: self._open[ident]} if ident in self._open else {}
        self._release_when_none_open()


_OPEN_SCOPES = _OpenScopes()
os.register_at_fork(after_in_child=_OPEN_SCOPES.after_fork)

#: Reads in most samples of a scope, after which it runs its samples eagerly.
READS_BEFORE_EAGER = 4

#: Seconds a read in another thread waits for the scope's thread to finish
#: recording a sample (``BatchingScope.read``).
OTHER_THREAD_WAIT = 30

#: What ``strategy=`` takes: the planners, and the reference executor.
STRATEGIES = PLANNERS + ("reference",)


class BatchingScope:
    """Context manager returned by :func:`batching`.

    Attributes
    ----------
    stats : BatchStats
        Counters and timings of the scope's flushes, complete after it exits.
    """

    def __init__(self, strategy=None, compiled=None, max_pending_nodes=None,
                 keep_plan=False, replay=True, analysis_budget=None, granularity=None):
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError("unknown strategy %r; choose one of %s" % (strategy, STRATEGIES))
        check_granularity(granularity)
        self.granularity = granularity
        check_max_pending(max_pending_nodes)
        for name, value in (("keep_plan", keep_plan), ("replay", replay)):
            if value not in (True, False):
                raise ValueError("%s must be True or False, got %r" % (name, value))
        self.strategy = strategy
        self.compiled = None if compiled is None else check_compiled(compiled)
        self.max_pending_nodes = max_pending_nodes
        self.keep_plan = keep_plan
        self.replay = replay
        self.analysis_budget = analysis_budget
        if analysis_budget is not None:
            budget.resolve_budget(analysis_budget)   # validates
        self.last_plan = None
        self.stats = BatchStats()
        self.recorder = None
        self._outer = None
        self._thread = None         # the thread that entered it
        self._mark = None
        self._executor = None       # compiled=True: this scope's (``run.choice``)
        self._reads = self._reads_counted = 0     # values read (``read``)
        self._own_reads = 0                         # of them, by the scope's own code
        self._where_read = None
        self._closing = False       # ended by an exception: waiting samples unwind
        self._opened_by = None      # the thread that opened it (``_OpenScopes``)

    def __enter__(self):
        if self.recorder is not None:
            raise RuntimeError(
                "this batching scope is open already (its with-block has not ended): enter a "
                "scope object once at a time, and nest a new gdb.batching() instead")
        outer = context.current()
        if outer is not None and getattr(outer, "closed", False):
            # Left by a scope of this thread that another thread ended (a
            # generator's scope closed by its consumer there).
            context.set_current(None)
            outer = None
        if outer is not None:
            # Nested scope: it joins the outer one; when it ends, the samples it
            # started finish (their errors raised there) and what is pending runs.
            self._outer = outer
            self.recorder = outer
            self._tasks_before = {id(task) for task in outer.tasks.started}
            self._note_nested_options()
            return self
        patches.install()
        dispatch.forget_replaced()
        self._closing = False
        self._executor = None
        self.recorder = Recorder(self.flush, read=self.read, recipe_for=recipe_for)
        self.recorder.scope = self
        self.recorder.entered = handlers.entry_frames(sys._getframe(1))  # pylint: disable=W0212
        if self.max_pending_nodes is not None:
            self.recorder.max_pending = self.max_pending_nodes
        self.recorder.replay = self.replay
        self._thread = threading.get_ident()
        self._opened_by = _OPEN_SCOPES.enter()
        context.set_current(self.recorder)
        self._mark = time.perf_counter()
        return self

    def _note_nested_options(self):
        """A nested scope runs with the outer scope's options and counts into its
        ``stats``: say so once when it was given options of its own."""
        given = [name for name, value, default in (
            ("strategy", self.strategy, None), ("compiled", self.compiled, None),
            ("max_pending_nodes", self.max_pending_nodes, None),
            ("keep_plan", self.keep_plan, False), ("replay", self.replay, True),
            ("analysis_budget", self.analysis_budget, None),
            ("granularity", self.granularity, None)) if value != default]
        if given:
            warn_once("nested options", "a batching scope opened inside another joins it: "
                      "its options (%s) are the outer scope's, and its calls count in the "
                      "outer scope's stats" % ", ".join(given))

    def __exit__(self, exc_type, exc, tb):
        if self._outer is not None:
            # (The outer scope may have ended first: two generators, each
            # yielding from a scope of its own, consumed in turn.  Its end ran
            # what this one recorded.)
            outer = self._outer.scope
            rec, self._outer, self.recorder = self._outer, None, None
            if outer is not None and (exc_type is None or exc_type is GeneratorExit):
                _finish_own_tasks(rec.tasks, self._tasks_before)
                outer.flush()
            return False
        tasks = self.recorder.tasks
        try:
            # A generator closed while its scope is open (its consumer stopped
            # early) leaves by GeneratorExit: no failure, what it yielded is kept.
            if exc_type is None or exc_type is GeneratorExit:
                tasks.drain()           # samples waiting at reads finish, round by round
                self.flush()
                tasks.raise_first_error()
            else:
                why = _error_text(exc_type, exc)
                self._closing = True
                tasks.close(why)
                self._discard(why)
        except BaseException as err:
            tasks.close(_error_text(type(err), err))
            raise
        finally:
            context.set_current(None)
            self.recorder.close()
            self.recorder = None
            _OPEN_SCOPES.leave(self._opened_by)
        return False

    def _discard(self, why):
        """Drop everything pending; its values raise a clear error when read."""
        graph = self.recorder.graph
        graph.error = why
        graph.release()
        self.recorder.new_graph()

    def _strategy(self):
        return self.strategy or getattr(self.recorder, "strategy", None) or "depth"

    def granularity_now(self):
        """The granularity calls are recorded with: the scope's, else the first block's."""
        if self.granularity is not None:
            return self.granularity
        owner = getattr(self.recorder, "owner", None)
        return getattr(owner, "granularity", None) or "call"

    def reference_now(self):
        """Whether this scope runs the reference strategy."""
        return self._strategy() == "reference"

    def _compiled(self):
        if self.compiled is not None:
            return self.compiled
        return getattr(self.recorder, "compiled", False)

    def _budget(self):
        """(seconds of analysis allowed for this flush or None for no search,
        the recent execution seconds for ``"auto"``, else False)."""
        value = self.analysis_budget
        owner = getattr(self.recorder, "owner", None)
        if value is None and owner is not None:
            value = owner.analysis_budget
            if value is None and owner.strategy == "depth":
                value = "auto"      # the default: search only where it can pay
        if value is None:
            return None, False
        recent = owner.recent_execute_s if owner is not None else None
        return budget.resolve_budget(value), (recent if value == "auto" else False)

    def _cache(self):
        cache = getattr(self.recorder, "cache", None)
        return DEFAULT_CACHE if cache is None else cache   # an empty cache is falsy

    def read(self):
        """A value is read inside the scope.

        Inside a sample (a task, ``record.tasks``) the sample waits until the
        other samples wait or finish too, and what is pending runs for all of
        them at once.  Read by the scope's own code, what is pending runs now
        (a flush).  Code that reads a value after each sample's call (``for x in
        xs: float(model(x))``) runs samples one at a time: each read flushes a
        batch of about one sample, which costs more than eager execution.  After
        ``READS_BEFORE_EAGER`` such reads, in most of the samples started,
        the scope says so (once per model, naming the line that read) and
        records no more: later samples run eagerly, as fast as plain Gluon.
        Later scopes of the same model give up at their first such read.
        """
        self._reads += 1
        rec = self.recorder
        if rec is None:                 # ended meanwhile (read in another thread)
            return
        tasks = rec.tasks
        if threading.get_ident() != self._thread:
            self._read_in_another_thread(tasks)
            return
        if tasks.current is not None:
            tasks.wait()            # the sample waits; the others record (``tasks.py``)
            return
        if self._closing:           # a waiting sample's ``finally`` as the scope unwinds
            self.flush()
            return
        self._own_reads += 1
        if self._where_read is None:
            self._where_read = _read_place(self.recorder)
        self.flush()
        rec = self.recorder
        owner = getattr(rec, "owner", None)
        known = getattr(owner, "reads_inside", False)
        if rec.eager or self._own_reads * 2 < rec.num_samples \
                or self._own_reads < (1 if known else READS_BEFORE_EAGER):
            return
        rec.eager = True
        if owner is not None:
            owner.reads_inside = True   # its next scopes give up at their first read
        if not known:
            log.warning(
                "values are read while recording (%s): every read runs what is pending, "
                "so samples do not batch; the rest of this scope runs eagerly, one sample "
                "at a time. Read values after the scope to batch.", self._where_read)

    def _read_in_another_thread(self, tasks):
        """A value is read in another thread than the scope's (a pool mapping over
        the results): it flushes when the scope's thread records no sample and
        runs no flush (``Tasks.lock``); a thread that waited finds its value
        computed by the other's flush (this one runs what is left)."""
        while not tasks.lock.acquire(timeout=OTHER_THREAD_WAIT):
            rec = self.recorder
            if rec is None or not rec.flushing:     # (a long flush: wait on)
                raise BatchingError(
                    "a value of a batching scope open in another thread is read while that "
                    "thread has recorded a sample for %g s (is the sample waiting for this "
                    "thread?): read it after the scope has ended, or in the scope's thread"
                    % OTHER_THREAD_WAIT)
        try:
            if self.recorder is not None:   # (else the scope's end computed it)
                self.flush()
        finally:
            tasks.lock.release()

    def flush(self):
        """Plan and run everything pending; fill in the live LazyArrays."""
        if self._outer is not None:             # a nested scope: the outer one's flush
            outer = self._outer.scope
            if outer is not None:
                outer.flush()
            return
        with self.recorder.tasks.lock:
            self._flush_now()

    def _flush_now(self):
        rec = self.recorder
        graph = rec.graph
        start = time.perf_counter()
        rec.flushing = True     # (attributes the flush sets on blocks wait for no sample)
        # Sample numbers run on through the scope (errors name them), so a
        # flush counts the samples started since the previous one.
        stats = BatchStats(flushes=1, samples=rec.num_samples - rec.samples_flushed,
                           reads=self._reads - self._reads_counted,
                           nodes=rec.num_recorded, calls=rec.num_calls,
                           record_ms=1000.0 * (start - self._mark))
        rec.samples_flushed = rec.num_samples
        self._reads_counted = self._reads
        rec.num_recorded = rec.num_calls = 0
        rec.new_graph()
        literals.fill(graph)
        try:
            if not self.reference_now():
                t0 = time.perf_counter()
                if graph.links:
                    sums.rewrite(graph)
                scalars.rewrite(graph)
                stats.plan_ms = 1000.0 * (time.perf_counter() - t0)   # counted as planning
            live, needed = graph.live_and_needed()
            live = literals.hand_out(graph, live, rec.rows_token)
            if live:
                with context.modes_within(graph.mode):
                    self._run(graph, live, needed, stats)
                    if mx.autograd.is_recording():
                        context.note_batched(graph, self._thread)
        except Exception as err:
            graph.error = "%s: %s" % (type(err).__name__, err)
            if isinstance(err, (BatchingError, MemoryError)):
                raise           # (out of memory: as eager, for code that retries smaller)
            raise BatchingError("running the batched plan failed: %s" % err) from err
        finally:
            rec.flushing = False
            graph.release()
            self.stats.add(stats)
            _OPEN_SCOPES.collect_if_grown()
            self._mark = time.perf_counter()
        log.debug("flush: %s", stats)

    def _run(self, graph, live, needed, stats):
        strategy = self._strategy()
        ctx = graph.ctx
        if strategy == "reference":
            t0 = time.perf_counter()
            run_reference(needed, live, ctx)
            stats.execute_ms = 1000.0 * (time.perf_counter() - t0)
            ops = sum(1 for n in needed if n.kind != "leaf")
            stats.steps = stats.planned_nodes = ops
            stats.planners = {"reference": 1}
            return
        t0 = time.perf_counter()
        allowed, auto = self._budget()
        owner = getattr(self.recorder, "owner", None)
        if allowed is None or self.strategy is not None:
            plan = make_plan(needed, strategy)
            stats.planners = {strategy: 1}
        else:
            memory = owner.plan_memory if owner is not None else None
            plan, choice = budget.plan_within_budget(needed, allowed, memory=memory,
                                                     auto_execute_s=auto)
            stats.planners = {choice.strategy: 1}
            stats.reused_choices = int(choice.reused)
        t1 = time.perf_counter()
        mode = self._compiled()
        choice = owner.executors if mode is True and owner is not None else None
        if choice is not None:
            if self._executor is None:      # the scope's first flush
                self._executor = choice.begin()
            mode = self._executor
            if mode is True and len(plan.steps) > MAX_WHOLE_PLAN_STEPS:
                # Compiling a plan of so many steps takes seconds, more than
                # its whole run imperatively: its calls run now (not measured).
                mode, choice = False, None
        if mode == "plan" and len(plan.steps) > MAX_WHOLE_PLAN_STEPS:
            # Compiling and differentiating one graph of so many steps (a long
            # chain or sentence) costs many times their run: steps compiled apart.
            warn_once("long whole plan", "a plan of %d steps (more than %d: a long chain or "
                      "sequence) runs as compiled steps, not as one compiled graph, under "
                      "compiled='plan': compiled as one it took many times as long as its run",
                      len(plan.steps), MAX_WHOLE_PLAN_STEPS)
            mode = "step"
        if mode == "step":
            run_steps(plan, live, ctx, self._cache(), stats)
        elif mode:                                  # True or "plan": whole plans
            run_compiled(plan, live, ctx, self._cache(), stats)
        else:
            run_interpreted(plan, live, ctx, rows_out=bool(self.recorder.tasks.waiting))
        t2 = time.perf_counter()
        if choice is not None:
            choice.count(t2 - t1, plan.num_nodes)
        stats.plan_ms += 1000.0 * (t1 - t0)
        stats.execute_ms = 1000.0 * (t2 - t1)
        if owner is not None:       # for analysis_budget="auto"
            owner.recent_execute_s = (t2 - t1) if owner.recent_execute_s is None else \
                0.8 * owner.recent_execute_s + 0.2 * (t2 - t1)
        stats.steps = len(plan.steps)
        stats.planned_nodes = plan.num_nodes
        _note_program_batches(plan)
        _note_learning(stats, mode)
        if self.keep_plan:
            # Holding the plan keeps every node alive: only when asked for.
            self.last_plan = plan


def _note_learning(stats, mode):
    """Tell each block of this thread what this flush cost, run in ``mode``
    (``usage.Usage.note_learning``)."""
    flush_ms = stats.record_ms + stats.plan_ms + stats.execute_ms
    for usage in list(trie.store().usages.values()):
        usage.note_learning(flush_ms, mode)


def _note_program_batches(plan):
    """Tell each block how well its programs batched in ``plan`` (``usage.Usage``),
    for the samples its programs ran for (a flush after reads runs samples
    that started in earlier ones)."""
    seen = {}
    for step in plan.steps:
        usage = getattr(step.nodes[0].info, "usage", None)
        if usage is not None:
            counts = seen.setdefault(id(usage), [usage, 0, 0, set()])
            counts[1] += len(step.nodes)
            counts[2] += 1
            counts[3].update(node.sample for node in step.nodes)
    for usage, nodes, steps, samples in seen.values():
        usage.note_flush(nodes, steps, len(samples))


DEFAULT_CACHE = PlanCache(64)
_LIBRARIES = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(mx.__file__))


def _user_line(frame=None):
    """``file:line in function`` of the innermost frame of the user's code (from
    ``frame`` outwards, if given): not this package's, MXNet's, or code made at
    run time (MXNet's generated operators, ``<string>``)."""
    frame = frame or sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        if not name.startswith("<") and not path.startswith(_LIBRARIES):
            return "%s:%d in %s" % (path, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return "unknown place"


def _read_place(rec):
    """Where a value is read: the user's line, or the call of an opaque block the
    read happens in (its own code reads, on concrete values)."""
    found = rec.black_box
    if found is None:
        return _user_line(sys._getframe(1))  # pylint: disable=protected-access
    block, caller = found
    return "%s calls %s (%s), which runs as a black box on concrete values" % (
        _user_line(caller), type(block).__name__, block.name)


def map(fn, samples, *args, **options):  # pylint: disable=redefined-builtin
    """``[fn(sample, *args) for sample in samples]``, each call a task of one scope.

    Each call runs as a resumable task (``record.tasks``): where a sample reads
    a pending value (``x.asscalar()``, ``x.asnumpy()``) it waits while the other
    samples record, and what is pending runs for all of them at once.  Use it
    where the loop uses each sample's output at once (its loss) or where a
    sample's result is not one array; a plain loop of top-level calls, whose
    outputs are used after it, batches the same way.

    Parameters
    ----------
    fn : callable
        ``fn(sample, *args)``: one sample's work, in plain Python.
    samples : iterable
    *args
        Passed to every call after the sample.
    **options
        Options of :func:`batching`, checked always, used when no scope is
        open (inside one, its calls join it); any other keyword is a
        ``TypeError``: ``fn`` is given the positional arguments only.

    Returns
    -------
    list
        The results in the order of ``samples``.  An exception in one sample's
        call is raised once every other sample has finished.
    """
    try:
        scope = batching(**options)
    except TypeError as err:
        raise TypeError("gluon_dynbatch.map: its keyword arguments are options of "
                        "batching() (fn is given the sample and the positional "
                        "arguments): %s" % err) from None
    rec = context.current()
    if rec is not None:             # inside a scope: its calls join it, no flush at the end
        return _map_tasks(rec.tasks, fn, samples, args)
    with scope:
        return _map_tasks(scope.recorder.tasks, fn, samples, args)


def _finish_own_tasks(tasks, before):
    """A nested scope's end: the samples started inside it (not among the ids
    ``before``) finish, as at a scope's end, and the first error among them is
    raised there, not at the outer scope's end."""
    mine = [task for task in tasks.started if id(task) not in before]
    _finish(tasks, mine)
    for task in mine:
        if task.error is not None:
            raise task.error


def _finish(tasks, mine):
    """Run the tasks ``mine`` to their end (the scope's code runs every waiting
    task; a sample waits for each of its own) and collect them: their errors
    are raised by the caller, not again at the scope's end."""
    if not mine:
        return
    if tasks.current is None:
        tasks.drain()
    else:
        for task in mine:
            tasks.drain(task)
    ids = {id(task) for task in mine}
    tasks.started = [task for task in tasks.started if id(task) not in ids]


def _map_tasks(tasks, fn, samples, args):
    call = next(_MAP_CALLS)
    started = [tasks.start(fn, (sample,) + tuple(args)) for sample in samples]
    _finish(tasks, started)
    for index, task in enumerate(started):
        if task.error is not None:
            _note_sample(task.error, index, call)
            raise task.error
    return [dense_results(tasks.rec, task.result) for task in started]


_MAP_CALLS = itertools.count()      # numbers ``gdb.map``'s calls, in the order they start
_MAP_NOTE = "gluon_dynbatch: raised by gdb.map's call for samples[%d]"


def _note_sample(err, index, call):
    """Say which of the samples of ``gdb.map``'s call number ``call`` raised
    ``err``: after the notes of calls nested in it (started later), in place
    of those of earlier calls (an exception object raised again)."""
    noted = getattr(err, "_gdb_map_call", None)
    if noted is not None and noted < call:
        err.__notes__ = [note for note in err.__notes__
                         if not note.startswith(_MAP_NOTE.split("[", 1)[0])]
    err.add_note(_MAP_NOTE % index)
    try:
        err._gdb_map_call = call  # pylint: disable=protected-access
    except AttributeError:        # an exception type without attributes of its own
        pass


#: ``compiled=True`` runs a plan of more steps than this (a chain hundreds of
#: calls deep, a loop over a long sequence) as imperative calls, never as a
#: whole compiled plan: MXNet builds such a graph in seconds (1.8k nodes in
#: 600 steps took about 3 s), each new plan shape again.
MAX_WHOLE_PLAN_STEPS = 200

GRANULARITIES = ("call", "op")


def check_granularity(value):
    """Raise ValueError unless ``value`` is None or one of ``GRANULARITIES``."""
    if value is not None and value not in GRANULARITIES:
        raise ValueError("unknown granularity %r; choose one of %s" % (value, GRANULARITIES))


def _error_text(exc_type, exc):
    """``"Type: message"`` of an exception, whose ``str`` is the user's code
    and may itself raise."""
    try:
        message = str(exc)
    except Exception:  # pylint: disable=broad-except
        message = "(its message could not be made)"
    return "%s: %s" % (exc_type.__name__, message)


def check_max_pending(value):
    """Raise ValueError unless ``value`` is None or a whole number of at least 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError("max_pending_nodes must be a whole number of at least 1, got %r"
                         % (value,))


COMPILED = (False, True, "plan", "step")


def check_compiled(value):
    """``value`` as a ``compiled`` setting (``True``/``False`` for truth
    values); ValueError unless it is one of ``COMPILED``."""
    if isinstance(value, str):
        if value in COMPILED:
            return value
    elif value in (False, True):
        return bool(value)
    raise ValueError("unknown compiled setting %r; choose one of %s" % (value, COMPILED))


def batching(strategy=None, compiled=None, max_pending_nodes=None, keep_plan=False,
             replay=True, analysis_budget=None, granularity=None):
    """Open a batching scope on this thread.

    Inside it, calls of :class:`DynBatchBlock` s (and of any child block, ``F``
    operator, arithmetic or indexing on their values) are recorded; when the
    scope ends they run as batched steps and every returned value becomes an
    ordinary ``NDArray``.  Reading a value inside the scope runs what is
    pending first.

    Parameters
    ----------
    strategy : str, optional
        ``"depth"``, ``"agenda"``, ``"unbatched"`` or ``"reference"``;
        defaults to the strategy of the first DynBatchBlock called ("depth").
    compiled : bool, "plan" or "step", optional
        ``"plan"``: run each flush as one compiled MXNet graph (CachedOp),
        cached by plan shape (a plan of more than ``MAX_WHOLE_PLAN_STEPS``
        steps as compiled steps).  ``"step"``: compile and cache each step
        separately (shapes of steps repeat across batches even when whole plans
        do not).  ``False``: batched imperative calls.  ``True``: whichever of
        the three has cost the model least per planned node, compiles
        included, measured on its own scopes (``run.choice``); a plan of more
        than ``MAX_WHOLE_PLAN_STEPS`` steps (a long chain or sequence) is
        never compiled whole.  Defaults to the setting of the first
        DynBatchBlock called.
    max_pending_nodes : int, optional
        Bound on recorded, not yet executed nodes (default 500,000, about
        0.5 GB): past it the scope flushes by itself, so memory stays bounded.
        Values still held are computed then; results do not change, only how
        much is batched together.
    keep_plan : bool, default False
        Keep the last flush's plan as ``scope.last_plan`` for inspection
        (its steps and their nodes); off by default since it holds the graph.
    replay : bool, default True
        Run a child block's ``hybrid_forward`` once per call shape and reuse
        what it recorded for later calls (``frames.py``).  Like
        ``hybridize()``, this assumes a child's ``hybrid_forward`` depends only
        on its inputs, parameters and attributes (a child whose numbers or
        strings changed learns its calls anew, ``trie.settings``); turn it off
        for blocks whose behaviour depends on state kept elsewhere (a global,
        a list).  DynBatchBlocks' own code always runs.
    analysis_budget : float or "auto", optional
        Seconds of planning per flush: starting from "depth", other strategies
        are tried while the budget lasts and the plan with the lowest cost
        (measured on this machine: launches, gathers, rows) is kept.  "auto"
        searches only when the depth plan has more steps than its lower bound
        and the estimated gain pays for the search (``budget.auto_budget``).  Ignored
        when ``strategy`` is given here.  Defaults to the first DynBatchBlock's.
    granularity : {"call", "op"}, optional
        ``"call"`` (the default): each DynBatchBlock call, and each child-block
        call outside one, is recorded as a template (``frames.py``) and runs
        as one program node when its operators batch row by row (its batched
        form compiled once per program, ``programs.py``), else as programs of
        its row-wise runs and a node per other operator.  ``"op"``: every
        operator one node.  Defaults to the first DynBatchBlock's.

    Returns
    -------
    BatchingScope
        Its ``stats`` describe the work done.
    """
    return BatchingScope(strategy, compiled, max_pending_nodes, keep_plan, replay,
                         analysis_budget, granularity)
