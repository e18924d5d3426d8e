"""Planning: order the recorded operator nodes into batched steps.

Planners (``strategy=`` of ``DynBatchBlock`` or ``batching``, which also
takes ``"reference"``: no plan, every node run by itself):

``"depth"``
    TensorFlow Fold / the first Gluon prototype: nodes with the same signature
    at the same depth (longest path from the inputs) form one step.
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

from .graph import OP, op_deps

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
        return _depth_plan(ops)
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


def _depth_plan(ops):
    groups = {}
    for node in ops:
        key = (node.depth, node.sig)
        group = groups.get(key)
        if group is None:
            groups[key] = [node]
        else:
            group.append(node)
    # Within a depth, steps go in a canonical order (not the order signatures
    # were first met), so that batches with the same structure get the same
    # plan shape and compiled plans can be reused.
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], canonical(item[1][0])))
    return Plan([Step(key[1], tuple(group)) for key, group in ordered])


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
    waiting = {}
    consumers = {}
    depth_sum, count = {}, {}
    ready = {}
    memo = {}
    for node in ops:
        clock.tick()
        deps = op_deps(node, memo)
        waiting[node] = len(deps)
        for dep in deps:
            consumers.setdefault(dep, []).append(node)
        depth_sum[node.sig] = depth_sum.get(node.sig, 0) + node.depth
        count[node.sig] = count.get(node.sig, 0) + 1
        if not deps:
            ready.setdefault(node.sig, []).append(node)
    mean_depth = {sig: depth_sum[sig] / count[sig] for sig in count}
    plan = Plan()
    while ready:
        sig = min(ready, key=mean_depth.__getitem__)
        batch = ready.pop(sig)
        clock.tick()
        plan.steps.append(Step(sig, tuple(batch)))
        for node in batch:
            for consumer in consumers.get(node, ()):
                waiting[consumer] -= 1
                if waiting[consumer] == 0:
                    ready.setdefault(consumer.sig, []).append(consumer)
    if plan.num_nodes != len(ops):
        raise RuntimeError("internal error: the graph has a cycle or a lost dependency")
    return plan
