"""Planning: order the recorded operator nodes into batched steps.

Planners (``strategy=`` of ``DynBatchBlock`` or ``batching``, which also
takes ``"reference"``: no plan, every node run by itself):

``"depth"``
    TensorFlow Fold / the first Gluon prototype: nodes with the same signature
    at the same depth (longest path from the inputs) form one step.  Where
    that splits a signature over more depths than aligning the samples' ends
    would (the tail after a loop of a sample-dependent length), that
    signature's nodes go as late as possible instead, when it makes fewer steps.
``"agenda"``
    DyNet's agenda: repeatedly run every ready node of the signature whose
    nodes lie shallowest on average, so a signature waits while more of its
    nodes can still become ready.
``"unbatched"``
    One node per step, in recording order: exercises the executor without batching.

Planners other than ``"depth"`` take a ``deadline`` (a ``time.perf_counter``
value): past it they raise :class:`OutOfTime`, so an analysis budget holds
while a plan is being searched, not only between searches.
"""
import time
from dataclasses import dataclass, field
from typing import Tuple

from ..ir.graph import OP
from . import _agenda

PLANNERS = ("depth", "agenda", "unbatched")
_CLOCK_EVERY = 64      # nodes or steps between looks at the clock


class OutOfTime(Exception):
    """A planner passed its deadline."""


@dataclass(frozen=True)
class Step:
    """Nodes of one signature run as one batched call."""

    sig: object
    nodes: Tuple


@dataclass
class Plan:
    """The steps of one flush, in execution order."""

    steps: list = field(default_factory=list)

    @property
    def num_nodes(self):
        return sum(len(s.nodes) for s in self.steps)


def make_plan(nodes, strategy="depth", deadline=None):
    """Plan the operator nodes among ``nodes`` (creation order) with ``strategy``.

    ``deadline`` (a ``time.perf_counter()`` value) bounds the search of the
    planners other than ``"depth"``: past it they raise :class:`OutOfTime`.
    """
    ops = [n for n in nodes if n.kind == OP]
    if strategy == "depth":
        return _depth_plan(nodes, ops)
    if strategy == "agenda":
        return _agenda_plan(ops, _Clock(deadline))
    if strategy == "unbatched":
        return Plan([Step(n.sig, (n,)) for n in ops])
    raise ValueError("unknown strategy %r; choose one of %s" % (strategy, PLANNERS))


class _Clock:
    """Looks at the clock every ``_CLOCK_EVERY`` ticks; raises past the deadline."""

    __slots__ = ("deadline", "ticks")

    def __init__(self, deadline):
        self.deadline = deadline
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        if self.deadline is not None and self.ticks % _CLOCK_EVERY == 0 \
                and time.perf_counter() > self.deadline:
            raise OutOfTime()


def _depth_plan(nodes, ops):
    plan = _grouped(ops, {})
    sunk = _sunk_levels(nodes, ops, plan)
    if sunk:
        other = _grouped(ops, sunk)
        if len(other.steps) < len(plan.steps):
            return other
    return plan


def _grouped(ops, levels):
    """Steps of the nodes with one signature at one level (``levels`` or their depth)."""
    groups = {}
    for node in ops:
        key = (levels.get(node, node.depth), node.sig)
        group = groups.get(key)
        if group is None:
            groups[key] = [node]
        else:
            group.append(node)
    # Within a level, steps go in a canonical order (not the order signatures
    # were first met), so that batches with the same structure get the same
    # plan shape and compiled plans can be reused.
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], canonical(item[1][0])))
    return Plan([Step(key[1], tuple(group)) for key, group in ordered])


def _sunk_levels(nodes, ops, plan):
    """Levels with the tails of samples aligned at the end, or {} if none helps.

    Depth aligns samples at their start: what follows a loop of a
    sample-dependent length (a classifier and loss after the last token)
    lands at a different depth in every sample, one step per length.  Here
    each signature whose nodes are spread over more depths than "as late as
    possible" levels (the plan's last depth minus the longest path to an
    output) takes the latter; every node then goes no earlier than one level
    after its inputs.  ``nodes`` are all the nodes (views pass levels on).
    """
    spread = {}
    for step in plan.steps:
        spread[step.sig] = spread.get(step.sig, 0) + 1
    # Tails run once per sample: only signatures spread over several depths
    # with at most one node per sample are candidates (this keeps the search
    # off trees, whose cells run many times per sample at every depth).
    candidates = {sig for sig, count in spread.items() if count > 1}
    if not candidates:
        return {}
    samples = {}
    for step in plan.steps:
        if step.sig in candidates:
            seen = samples.setdefault(step.sig, set())
            for node in step.nodes:
                if node.sample in seen:
                    candidates.discard(step.sig)
                    break
                seen.add(node.sample)
    if not candidates:
        return {}
    # Longest path in operators from each node to an output, by node id.
    height = [0] * (nodes[-1].id + 1)
    for node in reversed(nodes):
        above = height[node.id] + (node.kind == OP)
        for src, _ in node.inputs:
            if height[src.id] < above:
                height[src.id] = above
        for dep in node.deps:
            if height[dep.id] < above:
                height[dep.id] = above
    last = max(node.depth for node in ops)
    late = {}
    for node in ops:
        if node.sig in candidates:
            late.setdefault(node.sig, set()).add(height[node.id])
    sink = {sig for sig, found in late.items() if len(found) < spread[sig]}
    if not sink:
        return {}
    return _legal_levels(nodes, sink, last, height)


def _legal_levels(nodes, sink, last, height):
    """Levels of the op nodes: as late as possible for signatures in ``sink``,
    their depth for the others, then no earlier than one after their inputs."""
    level = [0] * (nodes[-1].id + 1)
    levels = {}
    for node in nodes:
        below = 0
        for src, _ in node.inputs:
            if level[src.id] > below:
                below = level[src.id]
        for dep in node.deps:
            if level[dep.id] > below:
                below = level[dep.id]
        if node.kind == OP:
            want = last - height[node.id] if node.sig in sink else node.depth
            below = want if want > below else below + 1
            levels[node] = below
        level[node.id] = below
    return levels


def canonical(node):
    """A sort key of a node's signature that does not depend on node ids."""
    shared = []
    for src, idx in node.inputs:
        if src.param is not None:
            shared.append(src.param.name)
        elif src.op is not None:
            shared.append(src.op.name)
        else:
            shared.append("")
    return (node.op.name, repr(node.attrs), repr(node.meta), tuple(shared),
            repr([s[1:] for s in node.out_shapes]))


def _agenda_plan(ops, clock):
    """DyNet's agenda over ``ops`` (compiled: ``_agenda.agenda_batches``)."""
    if not ops:
        return Plan()
    num_ids = max(node.id for node in ops) + 1
    batches = _agenda.agenda_batches(ops, num_ids, clock.deadline, _CLOCK_EVERY, OutOfTime)
    plan = Plan([Step(sig, nodes) for sig, nodes in batches])
    if plan.num_nodes != len(ops):
        raise RuntimeError("internal error: the graph has a cycle or a lost dependency")
    return plan
