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
from ..ir import calls
from ..ir.calls import ADDS
from ..ir.graph import OP, VIEW, Node, slots_of
from ..ir.ops import opdef
from ..ir._scan import slot_offset
from . import _sums

MAX_TERMS = 4096            # longer chains are rewritten in pieces of at most this many
_SUM_KWARGS = {"axis": 0, "keepdims": True}


def rewrite(graph):
    """Rewrite the chains of ``graph.links`` (see the module docstring) in place.

    Node ids stay the creation order (each new view comes just before its
    sum), and depths are computed again.  Returns the number of chains
    rewritten.  The visits of the nodes are compiled (``_sums``).
    """
    links = graph.links
    graph.links = []
    if not _sums.chained(links, ADDS):
        return 0
    absorbed, roots = _sums.chains(graph.nodes, links, ADDS, MAX_TERMS, _held)
    if not roots:
        return 0
    graph.nodes = _sums.rebuild(graph.nodes, links[0].id, absorbed, roots,
                                lambda root, terms: _stacked(graph, root, terms))
    return len(roots)


def _held(node):
    """Whether the user still holds ``node``'s output."""
    outs = node.outs
    ref = outs[0] if outs else None
    lazy = ref() if ref is not None else None
    return lazy is not None and lazy._node is node


def _stacked(graph, root, terms):
    """The view stacking ``terms``, ``root`` made their sum (``_become_sum``)."""
    view = _stack_view(graph, root, terms)
    _become_sum(root, view)
    return view


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


_sums.bind(Node, slot_offset)
