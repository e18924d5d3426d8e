"""The recorded graph: nodes for leaves and operator calls, in creation order.

Creation order is a topological order: a node's inputs always exist before it.
A value is referenced as ``(node, output_index)``.
"""
from . import _scan

LEAF, OP, VIEW = "leaf", "op", "view"
NO_KWARGS = {}   # shared by nodes without keyword arguments; never mutated


class Node:
    """One recorded item.

    Attributes
    ----------
    kind : str
        ``"leaf"`` (a concrete array or a Parameter), ``"op"`` (an operator
        call, scheduled as a step) or ``"view"`` (rows of other values, no step).
    op : OpDef or None
        The operator (name and callables), for op and view nodes.
    inputs : list of (Node, int)
        Input values, in the order of ``ArgTemplate`` slots.
    args, kwargs : tuple, dict
        Call template: ``Slot(k)`` stands for ``inputs[k]``; others are constants.
    out_shapes, out_dtypes : list
        One entry per output.
    sig : hashable or None
        Batching signature: nodes with equal signatures may run as one step.
        A unique object for nodes that must run alone; None for leaves and views.
    rule : Rule or None
        How the node batches (see ``rules.py``).
    deps : tuple of Node
        Extra op nodes this one waits for besides its inputs (ordering of
        stateful operators); ``op_deps`` gives all of them.
    depth : int
        1 + the largest depth among the inputs (0 for leaves; views take the
        max of their inputs).
    sample, path : int, tuple
        Which top-level call recorded it and where, for error messages.
    at : tuple or None
        During a walk of a plan, where an op node's one-row outputs are
        (``run.lowering.SegmentWalker.assign``).
    """

    __slots__ = ("id", "graph", "kind", "op", "inputs", "args", "kwargs",
                 "out_shapes", "out_dtypes", "sig", "rule", "deps", "depth",
                 "sample", "path", "value", "param", "outs", "meta", "attrs", "info", "at")

    def __init__(self, graph, kind, op=None, inputs=(), args=(), kwargs=None):
        _fill(self, graph, kind, op, inputs, args, NO_KWARGS if kwargs is None else kwargs,
              out_shapes=None, out_dtypes=None, rule=None, meta=None, attrs=None, info=None,
              sample=None, path=())

    def __repr__(self):
        name = self.op.name if self.op is not None else (
            "param:" + self.param.name if self.param is not None else "array")
        return "Node(%d, %s, %s, %s)" % (self.id, self.kind, name, self.out_shapes)

    def rows(self, idx=0):
        """Rows of output ``idx`` along axis 0."""
        return self.out_shapes[idx][0]



def analysed_node(graph, kind, op, inputs, args, kwargs, info, sample, path):
    """A node of a call whose analysis ``info`` (a CallInfo) is already known.

    The recorder's fast paths make one per recorded call: every slot is set
    once, where ``Node(...)`` and then the analysed fields would set eight of
    them twice.
    """
    node = _NEW_NODE(Node)
    _fill(node, graph, kind, op, inputs, args, kwargs, info.out_shapes, info.out_dtypes,
          info.rule, info.meta, info.attrs, info, sample, path)
    return node


def _fill(node, graph, kind, op, inputs, args, kwargs, out_shapes, out_dtypes, rule,
          meta, attrs, info, sample, path):
    """Set every slot of ``node`` (see the attributes of :class:`Node`)."""
    node.graph = graph
    node.id = len(graph.nodes)
    node.kind = kind
    node.op = op
    node.inputs = inputs
    node.args = args
    node.kwargs = kwargs
    node.out_shapes = out_shapes
    node.out_dtypes = out_dtypes
    node.sig = None
    node.rule = rule
    node.deps = ()
    node.depth = 0
    node.sample = sample
    node.path = path
    node.value = None      # leaf: the concrete NDArray
    node.param = None      # leaf: the gluon Parameter
    node.outs = None       # weakrefs to the LazyArrays of the outputs
    node.meta = meta       # rule-specific facts (roles of the inputs)
    node.attrs = attrs     # hashable constant arguments (for signatures and cache keys)
    node.info = info       # the recorder's CallInfo (shared by calls of one shape)
    node.at = None         # set by a walk (run.lowering.SegmentWalker.assign)


_NEW_NODE = object.__new__


class Slot:
    """Placeholder in a call template for the k-th array input.

    Use ``slot(k)``: slots are interned so that templates hash and compare
    by value, which lets the recorder memoise per call shape.
    """

    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return "Slot(%d)" % self.k

    def __reduce__(self):
        return (slot, (self.k,))


_SLOTS = [Slot(k) for k in range(64)]


def slot(k):
    """The interned Slot for input ``k``."""
    return _SLOTS[k] if k < 64 else Slot(k)


_SLOTS_OF = {}              # n -> the n slots of an n-argument call


def slots_of(n):
    """The tuple ``(slot(0), ..., slot(n - 1))``, interned."""
    found = _SLOTS_OF.get(n)
    if found is None:
        found = _SLOTS_OF[n] = tuple(slot(k) for k in range(n))
    return found


def _released():
    raise RuntimeError("internal error: a value of a finished graph was never computed")


class Graph:
    """Nodes recorded since the last flush of a scope."""

    def __init__(self, ctx, flush_fn, read_fn=None):
        self.nodes = []
        self.ctx = ctx
        self.flush_fn = flush_fn
        self.read_fn = read_fn or flush_fn   # a value is read: its graph runs
        self.error = None          # set when the scope failed
        self.leaf_by_id = {}       # id(NDArray or Parameter) -> (leaf Node, LazyArray, it)
        self.param_arrays = {}     # id(NDArray) -> it, the data of a parameter leaf
        self.parameters = {}       # id(Parameter) -> it, of a leaf
        self.variables = {}        # id(NDArray) -> it, a leaf with a gradient attached
        self.param_dicts = {}      # id(block) -> (block, {name: LazyArray}) of its params
        self.externals = {}        # id(program recipe) -> (it, parameters here, signature, depth)
        self.constants = {}        # (F path, args) -> leaf of a deterministic F.zeros ...
        self.shared_items = {}     # id(array) -> frame key item of a parameter or constant
        self.held = []             # values keyed by id above that only the graph holds
        self.literals = {}         # (dtype, row shape) -> (leaf, numpy parts): literals.py
        # Keyed by the leaves themselves: a flush's passes renumber nodes (``sums.py``).
        self.literal_leaves = set()    # those leaves
        self.literal_parts = {}    # (such a leaf, first row) -> the literal's values
        self.known_leaves = {}     # leaf -> whether it is a constant (literals.py)
        self.sparse_leaves = set()  # leaves of sparse arrays (CSR, row-sparse)
        self.sparse_grad_leaves = set()     # leaves whose attached gradient is sparse
        self.weight_calls = {}     # call on weights only -> its node (weight_calls.py)
        self.weight_nodes = set()  # those nodes
        self.derived = {}          # id of such a node -> its outputs' DerivedWeights
        self.derived_nodes = {}    # id(DerivedWeight) -> (it, its node here)
        self.mode = None           # autograd's (recording, training) of its calls
        self.links = []            # additions that may form chains (``sums.py``)
        self.spans = {}            # id(array) -> (it, its memory): ``aliases.shares_with_pending``

    def add(self, node):
        self.nodes.append(node)
        return node

    def release(self):
        """Forget the nodes once they ran (or failed).

        The graph and its nodes reference each other; dropping the graph's
        side lets reference counting free a flushed batch at once, instead of
        leaving tens of thousands of objects to the cyclic garbage collector.
        """
        self.nodes = []
        self.leaf_by_id = {}
        self.param_arrays = {}
        self.parameters = {}
        self.variables = {}
        self.param_dicts = {}
        self.externals = {}
        self.constants = {}
        self.shared_items = {}
        self.held = []
        self.literals = {}
        self.literal_leaves = set()
        self.literal_parts = {}
        self.known_leaves = {}
        self.sparse_leaves = set()
        self.sparse_grad_leaves = set()
        self.weight_calls = {}
        self.weight_nodes = set()
        self.derived = {}
        self.derived_nodes = {}
        self.links = []
        self.spans = {}
        self.flush_fn = self.read_fn = _released

    def live_and_needed(self):
        """(live, needed): every output a user still holds, as ``(node, idx,
        LazyArray)``, and the nodes they depend on, in creation order.

        One backward pass over the nodes finds both (compiled: ``_scan``):
        creation order is topological, so a node is known to be needed (held
        by a user, or an input of a needed node) before its inputs are visited.
        """
        return _scan.live_and_needed(self.nodes)

    def lint(self):
        """Check the invariants; raise AssertionError naming the first broken one."""
        for i, node in enumerate(self.nodes):
            assert node.id == i, "node ids must follow creation order"
            assert node.graph is self, "node of another graph"
            for src, idx in node.inputs:
                assert src.graph is self and src.id < node.id, \
                    "input %r of %r is not an earlier node" % (src, node)
                assert 0 <= idx < len(src.out_shapes), "bad output index"
            if node.kind == LEAF:
                assert not node.inputs and (node.value is not None or node.param is not None)
            else:
                assert node.op is not None and node.out_shapes
                deps = op_deps(node)
                assert all(d.kind == OP for d in deps)
                want = max((d.depth for d in deps), default=0)
                if node.kind == OP:
                    assert node.sig is not None, "op node without signature"
                    want += 1
                assert node.depth == want, "depth of %r" % node


def op_deps(node, memo=None):
    """The op nodes ``node`` waits for: op inputs, through views, and ``node.deps``.

    ``memo`` (a dict) caches the answers for views across calls.
    """
    deps = set(node.deps)
    for src, _ in node.inputs:
        kind = src.kind
        if kind == OP:
            deps.add(src)
        elif kind == VIEW:
            found = memo.get(src) if memo is not None else None
            if found is None:
                found = op_deps(src, memo)
                if memo is not None:
                    memo[src] = found
            deps.update(found)
    return deps


def weight_node(src):
    """Whether node ``src`` is a parameter or a value its graph computed from
    weights alone (False for frames and analysis stand-ins)."""
    if src.kind == LEAF:
        return src.param is not None
    return src.kind == OP and getattr(src, "graph", None) is not None \
        and src in src.graph.weight_nodes
