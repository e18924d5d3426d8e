"""Planning under an analysis budget, with a cost model measured on this machine.

``analysis_budget`` (seconds per flush, or ``"auto"``) trades analysis time
against batching gain: the planner starts with the cheapest strategy
("depth"), then tries the others while the budget lasts and keeps the plan
with the lowest estimated cost.  The cost model counts what a plan pays on
this machine (a launch per step, a gather per gathered input, a price per
row), with constants measured once per process, not guessed.

Planning is anytime: the depth plan is always at hand, and the other
candidates stop at the deadline, inside their search (``plan.OutOfTime``).
The cost model is calibrated before the clock starts.  A model remembers
which candidate won for each plan structure it has seen (the depth plan's
signatures), so a structure seen before costs no search: the
budget goes to new structures.
"""
import numbers
import time
from collections import OrderedDict, namedtuple

import mxnet as mx

from .planners import OutOfTime, make_plan
from ..ir.rules import KNOWN, SHARED

# Strategies in the order they are tried: cheapest analysis first.
CANDIDATES = ("depth", "agenda")
MEMORY_SIZE = 256           # plan structures whose winning candidate a model remembers
LOSSES_TO_STOP = 3          # "auto": searches in a row the depth plan won before it stops
RETRY_EVERY = 10            # ... except once in this many flushes
SEARCH_RATE = 2e-6          # seconds of search per operator node, before one is timed

Choice = namedtuple("Choice", ["strategy", "tried", "reused"])
Choice.__doc__ = """What planning within a budget did: the ``strategy`` whose plan was kept,
the candidates ``tried`` to the end, and whether the choice was ``reused`` from an earlier
flush with the same plan structure."""


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
                gathers += sum(1 for role in roles if role not in (SHARED, KNOWN))
        return steps * self.launch + gathers * self.gather + rows * self.row


_MODEL = None


def _time(fn, repeats=20, rounds=3):
    """Seconds a call of ``fn`` takes: the least of ``rounds`` means over
    ``repeats`` calls (a busy machine's pauses make some rounds longer)."""
    # Waits for fn's own results: ``waitall`` would also raise the errors of
    # the user's pending work, here, at the first flush.
    fn().wait_to_read()
    best = None
    for _ in range(rounds):
        start = time.perf_counter()
        outs = [fn() for _ in range(repeats)]
        for out in outs:
            out.wait_to_read()
        took = (time.perf_counter() - start) / repeats
        best = took if best is None else min(best, took)
    return best


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


def resolve_budget(budget):
    """Seconds of analysis allowed: ``budget`` itself; ``"auto"`` has no fixed
    part (:func:`auto_budget` sizes each search)."""
    if budget == "auto":
        return 0.0
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real) \
            or not budget >= 0:                                  # (NaN compares False)
        raise ValueError("analysis_budget must be seconds >= 0 or 'auto', got %r" % (budget,))
    return float(budget)


class PlanMemory(OrderedDict):
    """Plan structure -> winning candidate, and how recent searches went.

    ``losses`` counts the searches in a row that kept the depth plan,
    ``asked`` the flushes a search could have helped, ``rate`` the seconds
    a search took per operator node (None before the first), and
    ``speedup`` the depth plan's estimated cost over that of the plan the
    last flush ran (1 when it ran the depth plan): :func:`auto_budget` pays
    for searches that are expected to pay, stops paying for searches that
    keep losing, but tries again now and then.
    """

    def __init__(self):
        super().__init__()
        self.losses = 0
        self.asked = 0
        self.rate = None
        self.speedup = 1.0


def new_memory():
    """An empty memory of plan choices (one per model)."""
    return PlanMemory()


def structure_key(plan):
    """What identifies a plan's structure: its steps' signatures, in order.

    Step sizes are left out, as the plan cache leaves out row counts: batches
    of one model mostly differ only in them.
    """
    return tuple(step.sig for step in plan.steps)


def lower_bound(plan):
    """No plan of these nodes has fewer steps: max(longest chain, distinct signatures)."""
    chain, sigs = 0, set()
    for step in plan.steps:
        sigs.add(step.sig)
        for node in step.nodes:
            if node.depth > chain:
                chain = node.depth
    return max(chain, len(sigs))


def auto_budget(plan, model, recent_execute_s, memory=None):
    """Seconds ``"auto"`` allows a search that starts from ``plan`` (the depth plan).

    Nothing when the plan is at :func:`lower_bound` (no search can do better),
    or when the largest gain the bound leaves (the share of the depth plan's
    execution, measured where a flush has run, of the steps above it) is less
    than the search is expected to take (``rate`` seconds per operator node,
    :data:`SEARCH_RATE` before any search).
    Otherwise twice the expected time, at most half the execution time the
    depth plan would take: ``recent_execute_s`` times the speedup of the plan
    that ran (``PlanMemory.speedup``; a search that won makes the next
    flushes' execution faster, which must not make their searches look too
    dear).  A model whose last :data:`LOSSES_TO_STOP` searches all kept the
    depth plan gets nothing, except once in :data:`RETRY_EVERY` flushes.
    """
    steps = len(plan.steps)
    bound = lower_bound(plan)
    if steps <= bound:
        return 0.0
    if memory is not None:
        memory.asked += 1
        if memory.losses >= LOSSES_TO_STOP and memory.asked % RETRY_EVERY:
            return 0.0
    rate = memory.rate if memory is not None and memory.rate is not None else SEARCH_RATE
    expected = rate * plan.num_nodes
    execute = model.cost(plan) if recent_execute_s is None else recent_execute_s * (
        memory.speedup if memory is not None else 1.0)
    allowed = min(2.0 * expected, 0.5 * execute)
    # The gain is bounded in measured seconds where a flush has run: the cost
    # model counts launches, gathers and rows, not what a step costs in Python.
    if execute * (steps - bound) / steps < expected or allowed < expected:
        return 0.0
    return allowed


def plan_within_budget(nodes, budget_s, model=None, memory=None, auto_execute_s=False):
    """The cheapest plan found within ``budget_s`` seconds, and its :class:`Choice`.

    ``memory`` (from :func:`new_memory`) remembers the winner per plan
    structure, also when the budget cut the search short: a structure seen
    before runs its winner alone, so the budget goes to new structures.
    With ``auto_execute_s`` (the recent execution seconds, or None before
    any) the budget is :func:`auto_budget`'s instead of ``budget_s``.
    """
    model = model or calibrate()        # before the clock: measured once per process
    best = make_plan(nodes, CANDIDATES[0])      # always at hand: not on the clock
    key = structure_key(best) if memory is not None else None
    known = memory.get(key) if memory is not None else None
    auto = auto_execute_s is not False
    if known is not None:
        memory.move_to_end(key)
        if known == CANDIDATES[0]:
            memory.speedup = 1.0
            return best, Choice(known, (known,), True)
        # "auto" replans with a known winner whatever it takes: it paid before.
        deadline = None if auto else time.perf_counter() + budget_s
        try:
            plan = make_plan(nodes, known, deadline)
        except OutOfTime:
            memory.speedup = 1.0
            return best, Choice(CANDIDATES[0], (CANDIDATES[0],), True)
        memory.speedup = model.cost(best) / max(model.cost(plan), 1e-12)
        return plan, Choice(known, (known,), True)
    if auto:
        budget_s = auto_budget(best, model, auto_execute_s, memory)
    start = time.perf_counter()
    deadline = start + budget_s
    depth_cost = model.cost(best)
    best_cost, chosen, tried = depth_cost, CANDIDATES[0], [CANDIDATES[0]]
    for strategy in CANDIDATES[1:]:
        try:
            if time.perf_counter() >= deadline:
                raise OutOfTime()
            plan = make_plan(nodes, strategy, deadline)
        except OutOfTime:
            break
        tried.append(strategy)
        cost = model.cost(plan)
        if cost < best_cost:
            best, best_cost, chosen = plan, cost, strategy
    if memory is not None:
        _remember(memory, key, chosen, tried, auto, budget_s and
                  (time.perf_counter() - start) / max(best.num_nodes, 1))
        memory.speedup = depth_cost / max(best_cost, 1e-12)
    return best, Choice(chosen, tuple(tried), False)


def _remember(memory, key, chosen, tried, auto, rate):
    """Note the outcome of a search in ``memory``.

    A fixed budget's choice is remembered even if the budget cut the search
    short (its budget was spent once); under ``"auto"`` a cut search is not,
    and the time it took raises the expected rate, so the next one gets more.
    """
    if len(tried) > 1:
        memory.losses = memory.losses + 1 if chosen == CANDIDATES[0] else 0
        if rate:
            memory.rate = rate if memory.rate is None else 0.5 * (memory.rate + rate)
    elif auto:
        if rate:
            memory.rate = max(memory.rate or SEARCH_RATE, rate)
        return
    memory[key] = chosen
    if len(memory) > MEMORY_SIZE:
        memory.popitem(last=False)
