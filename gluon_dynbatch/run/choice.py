"""``compiled=True``: which executor runs a model's next scope, from what each cost.

Three executors can run a plan: the whole plan as one cached CachedOp
(``True``), one cached CachedOp per step (``"step"``) and batched imperative
calls (``False``).  Which is fastest depends on the model: whole plans pay a
compile for every plan shape not met before, steps for every new step shape,
and imperative calls a launch per step.  :class:`ExecutorChoice` measures the
time per planned node of each (compiles included) on the model's own scopes
and runs the cheapest, trying the others now and then, so that a model whose
plans stop repeating (or start to) changes executor.

A scope runs all its flushes with one executor and is measured as a whole: a
scope whose samples read values (hundreds of nodes in its first flushes, a
few in its last, whose cost per node differs far more than the executors'
does) is compared with scopes like it, not flush by flush.
"""
import logging
from collections import deque

log = logging.getLogger(__name__)

#: The executors, in the order the trial tries them: ``compiled`` values.
MODES = (True, "step", False)
NAMES = {True: "whole plans", "step": "compiled steps", False: "imperative calls"}
#: First scopes of a model, run as whole plans and not measured (parameters
#: get their shapes, the first plans are built).
WARMUP = 2
#: Measurements of each executor before the first choice.
TRIAL = 2
#: Measurements per executor the choice averages (the most recent ones; from
#: 4 on, without the largest: one pause of the machine is not the executor's).
WINDOW = 6
#: After the trial, an executor other than the cheapest runs again once it has
#: not run for ``EXPLORE`` scopes times how much slower it was (at most
#: ``MAX_SLOWER`` times), to keep its figure current.
EXPLORE = 16
MAX_SLOWER = 8
#: Another executor replaces the chosen one (imperative calls until the trial
#: ends) only when it is cheaper by this fraction: executors within noise of
#: each other do not alternate, and compiling must pay to be chosen.
MARGIN = 0.05
#: What the launch time does not show, as a fraction of it: each compiled
#: step is also a CachedOp call in the backward pass (measured on the
#: user-model suite: steps that launched 2-4% cheaper than imperative calls
#: trained 9-19% slower).
HIDDEN_COST = {True: 0.0, "step": 0.15, False: 0.0}


class ExecutorChoice:
    """The executor of each scope of one model under ``compiled=True``.

    A scope calls :meth:`begin` at its first flush and :meth:`count` after
    each; :meth:`next_mode` and :meth:`note` are the choice itself, one scope
    at a time.

    Parameters
    ----------
    name : str
        The model's name, for the log.

    Attributes
    ----------
    scopes : int
        Scopes noted so far.
    costs : dict
        Executor -> the last ``WINDOW`` times per planned node, seconds.
    measured_at : dict
        Executor -> the scope it last ran, -1 if never.
    best : bool or str
        The executor chosen (imperative calls, ``False``, until the trial ends).
    decided : bool
        Whether the trial has ended.
    """

    def __init__(self, name):
        self.name = name
        self.scopes = 0
        self.costs = {mode: deque(maxlen=WINDOW) for mode in MODES}
        self.measured_at = {mode: -1 for mode in MODES}
        self.best = False
        self.decided = False
        self.open = None        # the scope running: [executor, seconds, nodes]

    def begin(self):
        """A scope's first flush: note the model's previous scope, and return
        this scope's executor."""
        if self.open is not None:
            self.note(*self.open)
        mode = self.next_mode()
        self.open = [mode, 0.0, 0]
        return mode

    def count(self, seconds, nodes):
        """A flush of the current scope ran ``nodes`` planned nodes in ``seconds``."""
        self.open[1] += seconds
        self.open[2] += nodes

    def mean(self, mode):
        """Time per node of ``mode``: the mean of its window, from 4 measurements
        on without the largest (infinite if never measured)."""
        costs = sorted(self.costs[mode])
        if len(costs) >= 4:
            costs.pop()
        return sum(costs) / len(costs) if costs else float("inf")

    def in_trial(self):
        """Whether some executor still lacks its ``TRIAL`` measurements."""
        return any(len(self.costs[mode]) < TRIAL for mode in MODES)

    def next_mode(self):
        """The executor of the next scope: ``True`` (whole plans), ``"step"`` or
        ``False`` (imperative calls)."""
        if self.scopes < WARMUP:
            return True
        if self.in_trial():
            return min(MODES, key=lambda mode: (len(self.costs[mode]), MODES.index(mode)))
        due = [mode for mode in MODES if mode != self.best
               and self.scopes - self.measured_at[mode] >= self._interval(mode)]
        return min(due, key=self.measured_at.get) if due else self.best

    def _interval(self, mode):
        """Scopes between two runs of ``mode``, not the cheapest executor."""
        slower = self.mean(mode) / max(self.mean(self.best), 1e-12)
        return EXPLORE * min(max(slower, 1.0), MAX_SLOWER)

    def note(self, mode, seconds, nodes):
        """Note a scope whose flushes ran ``nodes`` planned nodes in ``seconds`` with ``mode``."""
        if self.scopes >= WARMUP and mode in self.costs and nodes:
            self.costs[mode].append(seconds / nodes)
            self.measured_at[mode] = self.scopes
        self.scopes += 1
        if self.scopes >= WARMUP and not self.in_trial():
            self._choose()

    def cost(self, mode):
        """What the choice compares: :meth:`mean` with ``HIDDEN_COST`` added."""
        return self.mean(mode) * (1.0 + HIDDEN_COST[mode])

    def _choose(self):
        best = min(MODES, key=self.cost)
        if self.cost(best) > (1.0 - MARGIN) * self.cost(self.best):
            best = self.best
        if best != self.best or not self.decided:
            log.info("%s: compiled=True runs %s from now on: %s", self.name, NAMES[best],
                     self.summary())
        self.best, self.decided = best, True

    def summary(self):
        """Each executor's time per node, in microseconds, as text."""
        return ", ".join("%s %.1f us a node" % (NAMES[mode], 1e6 * self.mean(mode))
                         for mode in MODES)
