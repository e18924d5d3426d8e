"""Chains of additions in the graph become segment sums.

Code that adds values one at a time -- ``total = total + x`` in a loop,
Python's ``sum(...)`` (which starts from the integer 0), ``F.add_n`` over a
list -- records a chain: each addition waits for the previous one, so a sum
of k terms is k steps deep, and the depth of everything computed from it
depends on k.  Sums over neighbours of different counts then never line up,
and a sum of every sample's loss inside the scope is one step per sample.

At a flush, before planning, every chain of additions of one-row values
whose intermediate sums nothing else reads (no other node, no LazyArray the
user still holds) becomes one node: its terms stacked along axis 0 by a view
(no step of its own) and summed over axis 0, which batches as a segment sum
(``rules.SegmentRule``).  Sums of any number of terms then share one step, at
the depth of their deepest term.  A single ``a + b`` stays as it is; a chain
is rewritten when it has two additions or more, or starts from zero, or is
an ``add_n``.

Frames do the same inside their templates (``vectorize.py``); this pass
covers what is recorded operator by operator.  The reference executor never
sees it: it runs the graph as recorded.
"""
from . import calls
from .calls import ADDS
from .graph import LEAF, OP, VIEW, Node, slots_of
from .ops import opdef

MAX_TERMS = 4096            # longer chains are rewritten in pieces of at most this many
_SUM_KWARGS = {"axis": 0, "keepdims": True}


def rewrite(graph):
    """Rewrite the chains of ``graph.links`` (see the module docstring) in place.

    Node ids stay the creation order (each new view comes just before its
    sum), and depths are computed again.  Returns the number of chains
    rewritten.
    """
    links = graph.links
    graph.links = []
    if not any(_chained(node, links) for node in links):
        return 0
    members = set(links)
    uses = _uses(graph.nodes, members)
    absorbed, roots = _chains(links, members, uses)
    if not roots:
        return 0
    nodes = []
    for node in graph.nodes:
        if node in absorbed:
            continue
        terms = roots.get(node)
        if terms is not None:
            view = _stack_view(graph, node, terms)
            view.id = len(nodes)
            nodes.append(view)
            _become_sum(node, view)
        node.id = len(nodes)
        nodes.append(node)
    graph.nodes = nodes
    _redepth(nodes)
    return len(roots)


def _chained(node, links):
    """Whether ``node`` would start or extend a chain (a cheap first look)."""
    if node.op.name not in ADDS:
        return True                             # add_n, or x + 0
    for src, _ in node.inputs:
        if src.kind == OP and src.info is not None and src.info.link:
            return True
    return False


def _uses(nodes, members):
    """How many times each link is read (by inputs or ordering constraints)."""
    uses = dict.fromkeys(members, 0)
    for node in nodes:
        for src, _ in node.inputs:
            if src in uses:
                uses[src] += 1
        for dep in node.deps:
            if dep in uses:
                uses[dep] += 2               # never absorbed
    return uses


def _held(node):
    """Whether the user still holds ``node``'s output."""
    outs = node.outs
    ref = outs[0] if outs else None
    lazy = ref() if ref is not None else None
    return lazy is not None and lazy._node is node


def _chains(links, members, uses):
    """(absorbed, roots): links folded into a later one, and each chain's last
    link with its terms."""
    found = {}                                # link -> (terms, additions, from zero)
    absorbed = set()
    for node in links:                        # creation order
        terms = []
        count, signal = 1, node.op.name not in ADDS
        for src, idx in node.inputs:
            inner = found.get(src)
            if inner is not None and uses[src] == 1 and not _held(src) \
                    and len(terms) + len(inner[0]) + len(node.inputs) <= MAX_TERMS:
                absorbed.add(src)
                del found[src]
                terms.extend(inner[0])
                count += inner[1]
                signal = signal or inner[2]
            else:
                terms.append((src, idx))
        found[node] = (terms, count, signal)
    roots = {node: terms for node, (terms, count, signal) in found.items()
             if count >= 2 or signal}
    return absorbed, roots


def _stack_view(graph, root, terms):
    """A view node stacking ``terms`` (one-row values) along axis 0."""
    view = Node(graph, VIEW, opdef("concat"), list(terms), slots_of(len(terms)), {"dim": 0})
    view.sample, view.path = root.sample, root.path
    info = _info(view)
    assert info.kind == VIEW, "a stack of one-row values is a view"
    return view


def _become_sum(root, view):
    """Make ``root`` (the chain's last addition) ``sum(view, axis=0, keepdims=True)``.

    The node keeps its identity, so the LazyArray the user holds is its output.
    """
    root.op = opdef("sum")
    root.inputs = [(view, 0)]
    root.args = slots_of(1)
    root.kwargs = _SUM_KWARGS
    root.deps = ()
    info = _info(root)
    root.rule, root.meta, root.info = info.rule, info.meta, info
    # A unique signature when the rule refuses (it runs alone, as before).
    root.sig = info.sig if info.sig is not None else ("alone", object())


def _info(node):
    """The CallInfo of ``node``'s call (memoised per call shape, as the recorder does)."""
    in_shapes = tuple(src.out_shapes[i] for src, i in node.inputs)
    in_dtypes = tuple(src.out_dtypes[i] for src, i in node.inputs)
    key = (node.op, node.args, tuple(node.kwargs.items()), in_shapes, in_dtypes)
    info = calls.INFOS.get(key)
    if info is None:
        info = calls.analyse(node, in_shapes, in_dtypes)
        calls.remember(key, info)
    node.out_shapes, node.out_dtypes, node.attrs = info.out_shapes, info.out_dtypes, info.attrs
    return info


def _redepth(nodes):
    """Depths again, in creation order: 1 + the deepest op input for op nodes."""
    for node in nodes:
        if node.kind == LEAF:
            continue
        depth = 0
        for src, _ in node.inputs:
            if src.depth > depth:
                depth = src.depth
        for dep in node.deps:
            if dep.depth > depth:
                depth = dep.depth
        node.depth = depth + 1 if node.kind == OP else depth
