"""``compiled=True``: which executor runs a model's next flush, from what each cost.

Three executors can run a plan: the whole plan as one cached CachedOp
(``True``), one cached CachedOp per step (``"step"``) and batched imperative
calls (``False``).  Which is fastest depends on the model: whole plans pay a
compile for every plan shape not met before, steps for every new step shape,
and imperative calls a launch per step.  :class:`ExecutorChoice` measures the
launch time per planned node of each (compiles included) on the model's own
flushes and runs the cheapest, trying the others now and then, so that a
model whose plans stop repeating (or start to) changes executor.
"""
import logging
from collections import deque

log = logging.getLogger(__name__)

#: The executors, in the order the trial tries them: ``compiled`` values.
MODES = (True, "step", False)
NAMES = {True: "whole plans", "step": "compiled steps", False: "imperative calls"}
#: First flushes of a model, run as whole plans and not measured (parameters
#: get their shapes, the first plans are built).
WARMUP = 2
#: Measurements of each executor before the first choice.
TRIAL = 2
#: Measurements per executor the choice averages (the most recent ones).
WINDOW = 6
#: After the trial, an executor other than the cheapest runs again once it has
#: not run for ``EXPLORE`` flushes times how much slower it was (at most
#: ``MAX_SLOWER`` times), to keep its figure current.
EXPLORE = 16
MAX_SLOWER = 8


class ExecutorChoice:
    """The executor of each flush of one model under ``compiled=True``.

    Parameters
    ----------
    name : str
        The model's name, for the log.

    Attributes
    ----------
    flushes : int
        Flushes noted so far.
    costs : dict
        Executor -> the last ``WINDOW`` launch times per planned node, seconds.
    best : bool or str
        The executor chosen after the trial (``True`` before it ends).
    """

    def __init__(self, name):
        self.name = name
        self.flushes = 0
        self.costs = {mode: deque(maxlen=WINDOW) for mode in MODES}
        self.measured_at = {mode: -1 for mode in MODES}
        self.best = True

    def mean(self, mode):
        """Mean launch time per node of ``mode`` (infinite if never measured)."""
        costs = self.costs[mode]
        return sum(costs) / len(costs) if costs else float("inf")

    def in_trial(self):
        """Whether some executor still lacks its ``TRIAL`` measurements."""
        return any(len(self.costs[mode]) < TRIAL for mode in MODES)

    def next_mode(self):
        """The executor of the next flush: ``True``, ``"step"`` or ``False``."""
        if self.flushes < WARMUP:
            return True
        if self.in_trial():
            return min(MODES, key=lambda mode: (len(self.costs[mode]), MODES.index(mode)))
        due = [mode for mode in MODES if mode != self.best
               and self.flushes - self.measured_at[mode] >= self._interval(mode)]
        return min(due, key=self.measured_at.get) if due else self.best

    def _interval(self, mode):
        """Flushes between two runs of ``mode``, not the cheapest executor."""
        slower = self.mean(mode) / max(self.mean(self.best), 1e-12)
        return EXPLORE * min(max(slower, 1.0), MAX_SLOWER)

    def note(self, mode, seconds, nodes):
        """Note that a flush ran ``nodes`` planned nodes with ``mode`` in ``seconds``."""
        if self.flushes >= WARMUP and mode in self.costs:
            self.costs[mode].append(seconds / max(nodes, 1))
            self.measured_at[mode] = self.flushes
        self.flushes += 1
        if self.flushes >= WARMUP and not self.in_trial():
            self._choose()

    def _choose(self):
        best = min(MODES, key=self.mean)
        if best != self.best:
            log.info("%s: compiled=True runs %s from now on: %s", self.name, NAMES[best],
                     self.summary())
        self.best = best

    def summary(self):
        """Each executor's mean launch time per node, in microseconds, as text."""
        return ", ".join("%s %.1f us a node" % (NAMES[mode], 1e6 * self.mean(mode))
                         for mode in MODES)
