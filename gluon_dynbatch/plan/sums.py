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
from itertools import islice

from ..ir import calls
from ..ir.calls import ADDS
from ..ir.graph import LEAF, OP, VIEW, Node, slots_of
from ..ir.ops import opdef

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
    if not any(_chained(node) for node in links):
        return 0
    nodes = graph.nodes
    first = links[0].id                       # nothing earlier reads a link
    uses = _uses(nodes, first, links)
    absorbed, roots = _chains(links, uses)
    if not roots:
        return 0
    kept = nodes[:first]
    for node in nodes[first:]:
        if node in absorbed:
            continue
        terms = roots.get(node)
        if terms is not None:
            view = _stack_view(graph, node, terms)
            view.id = len(kept)
            kept.append(view)
            _become_sum(node, view)
        node.id = len(kept)
        kept.append(node)
    graph.nodes = kept
    _redepth(kept, first)
    return len(roots)


def _chained(node):
    """Whether ``node`` would start or extend a chain (a cheap first look)."""
    if node.op.name not in ADDS:
        return True                             # add_n, or x + 0
    for src, _ in node.inputs:
        if src.kind == OP and src.info is not None and src.info.link:
            return True
    return False


def _uses(nodes, first, links):
    """How many times each link is read (by inputs or ordering constraints)."""
    uses = dict.fromkeys(links, 0)
    get = uses.get
    for node in islice(nodes, first + 1, None):
        for src, _ in node.inputs:
            count = get(src)
            if count is not None:
                uses[src] = count + 1
        if node.deps:
            for dep in node.deps:
                if dep in uses:
                    uses[dep] += 2           # never absorbed
    return uses


def _held(node):
    """Whether the user still holds ``node``'s output."""
    outs = node.outs
    ref = outs[0] if outs else None
    lazy = ref() if ref is not None else None
    return lazy is not None and lazy._node is node


def _chains(links, uses):
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


_INFOS = {}                 # (op name, terms, row shape, dtype) -> CallInfo


def _stack_view(graph, root, terms):
    """A view node stacking ``terms`` (one-row values) along axis 0."""
    view = Node(graph, VIEW, opdef("concat"), terms, slots_of(len(terms)), {"dim": 0})
    view.sample, view.path = root.sample, root.path
    _set_info(view, len(terms), root)
    return view


def _become_sum(root, view):
    """Make ``root`` (the chain's last addition) ``sum(view, axis=0, keepdims=True)``.

    The node keeps its identity, so the LazyArray the user holds is its output.
    """
    count = len(view.inputs)
    root.op = opdef("sum")
    root.inputs = [(view, 0)]
    root.args = slots_of(1)
    root.kwargs = _SUM_KWARGS
    root.deps = ()
    info = _set_info(root, count, root)
    # A unique signature when the rule refuses (it runs alone, as before).
    root.sig = info.sig if info.sig is not None else ("alone", object())


def _set_info(node, count, root):
    """Give ``node`` its call's CallInfo (memoised by the terms' count and row)."""
    key = (node.op.name, count, root.out_shapes[0], root.out_dtypes[0])
    info = _INFOS.get(key)
    if info is None:
        in_shapes = tuple(src.out_shapes[i] for src, i in node.inputs)
        in_dtypes = tuple(src.out_dtypes[i] for src, i in node.inputs)
        info = calls.analyse(node, in_shapes, in_dtypes)
        assert info.kind == (VIEW if node.kind == VIEW else OP), "a chain's %s" % node.op.name
        if info.cacheable:
            _INFOS[key] = info
    node.out_shapes, node.out_dtypes, node.attrs = info.out_shapes, info.out_dtypes, info.attrs
    node.rule, node.meta, node.info = info.rule, info.meta, info
    return info


def _redepth(nodes, first):
    """Depths again from node ``first`` on: 1 + the deepest op input for op nodes."""
    for node in islice(nodes, first, None):
        kind = node.kind
        if kind == LEAF:
            continue
        depth = 0
        for src, _ in node.inputs:
            if src.depth > depth:
                depth = src.depth
        for dep in node.deps:
            if dep.depth > depth:
                depth = dep.depth
        node.depth = depth + 1 if kind == OP else depth
