"""Planning under an analysis budget, with a cost model measured on this machine.

``analysis_budget`` (seconds per flush, or ``"auto"``) trades analysis time
against batching gain: the planner starts with the cheapest strategy
("depth"), then tries the others while the budget lasts and keeps the plan
with the lowest estimated cost.  The cost model counts what a plan pays on
this machine (a launch per step, a gather per gathered input, a price per
row), with constants measured once per process, not guessed.
"""
import time

import mxnet as mx

from .plan import make_plan
from .rules import SHARED

# Strategies in the order they are tried: cheapest analysis first.
CANDIDATES = ("depth", "agenda")
AUTO_FRACTION = 0.05        # "auto": analysis at most 5% of recent execution time
AUTO_DEFAULT = 0.002        # seconds, before any execution time is known


class CostModel:
    """Estimated seconds of a plan: ``steps*launch + gathers*gather + rows*row``."""

    def __init__(self, launch, gather, row):
        self.launch, self.gather, self.row = launch, gather, row

    def cost(self, plan):
        """Estimated execution seconds of ``plan``."""
        steps = len(plan.steps)
        gathers = rows = 0
        for step in plan.steps:
            rows += sum(n.out_shapes[0][0] for n in step.nodes)
            if len(step.nodes) > 1:         # shared inputs are passed once, not gathered
                roles = step.nodes[0].meta or ()
                gathers += sum(1 for role in roles if role != SHARED)
        return steps * self.launch + gathers * self.gather + rows * self.row


_MODEL = None


def _time(fn, repeats=20):
    fn()
    mx.nd.waitall()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    mx.nd.waitall()
    return (time.perf_counter() - start) / repeats


def calibrate(width=128):
    """Measure launch, gather and per-row costs of this machine (cached)."""
    global _MODEL  # pylint: disable=global-statement
    if _MODEL is not None:
        return _MODEL
    small = mx.nd.ones((1, width))
    big = mx.nd.ones((256, width))
    index = mx.nd.array(list(range(0, 256, 2)) * 2, dtype="int32")
    t_small = _time(lambda: mx.nd.tanh(small))
    t_big = _time(lambda: mx.nd.tanh(big))
    t_take = _time(lambda: mx.nd.take(big, index))
    row = max(t_big - t_small, 0.0) / 255
    _MODEL = CostModel(launch=t_small, gather=max(t_take - t_small, 0.0) + t_small, row=row)
    return _MODEL


def resolve_budget(budget, recent_execute_s):
    """Seconds of analysis allowed: ``budget`` itself, or the "auto" rule."""
    if budget == "auto":
        if recent_execute_s is None:
            return AUTO_DEFAULT
        return AUTO_FRACTION * recent_execute_s
    if budget is None or budget < 0:
        raise ValueError("analysis_budget must be seconds >= 0 or 'auto', got %r" % (budget,))
    return float(budget)


def plan_within_budget(nodes, budget_s, model=None):
    """The cheapest plan found within ``budget_s`` seconds; (plan, tried)."""
    start = time.perf_counter()
    model = model or calibrate()
    best = make_plan(nodes, CANDIDATES[0])
    best_cost = model.cost(best)
    tried = [CANDIDATES[0]]
    for strategy in CANDIDATES[1:]:
        if time.perf_counter() - start >= budget_s:
            break
        plan = make_plan(nodes, strategy)
        tried.append(strategy)
        cost = model.cost(plan)
        if cost < best_cost:
            best, best_cost = plan, cost
    return best, tried
