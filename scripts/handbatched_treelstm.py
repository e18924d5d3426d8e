"""A hand-batched Child-Sum Tree-LSTM: the practical limit for the benchmark.

The same math as :class:`examples.sick_model.ChildSumLSTMCell`, on the same
Parameters, written by hand for a whole batch of trees:

* nodes are grouped by height (leaves have height 1), so every child of a
  node of height ``l`` has a height below ``l``;
* numpy builds the index arrays of a batch (word ids, the rows of each
  level, each level's children and their parents); they are packed into one
  float32 buffer, copied to MXNet once, and fed as data through views;
* the whole forward pass of a batch is one symbolic graph run as one
  :class:`mxnet.nd.CachedOp`.  The graph only depends on the number of levels,
  so one CachedOp per distinct level count serves every batch.

Per level, with ``S`` the (nodes x children) 0/1 matrix of "child j belongs
to node i" and ``ch, cc`` the gathered child states::

    iou = x_iou + (S @ ch) U_iou^T
    f   = sigmoid(ch U_f^T + x_f[parent])
    c   = i * u + S @ (f * cc)
    h   = o * tanh(c)

Leaves skip the child terms (the per-node model feeds them a row of zeros,
which contributes exactly nothing to outputs and gradients).
"""
import logging
import time

import mxnet as mx
import numpy as np

LOG = logging.getLogger(__name__)

#: Parameter attribute names of ``ChildSumLSTMCell``, in graph order.
CELL_PARAMS = ("x_weight", "x_bias", "h_iou_weight", "h_f_weight")


class LevelPlan:
    """Index arrays of one batch of trees, grouped by node height.

    Parameters
    ----------
    trees : list of Tree
        Roots; every node's ``word`` must be set.

    Attributes
    ----------
    num_levels : int
        Height of the tallest tree.
    num_nodes : int
        Nodes of all trees.
    sizes : dict
        Name of each graph input -> its shape (a tuple).
    buffer : numpy.ndarray
        All index arrays, flattened and concatenated (float32).
    offsets : dict
        Name -> start of that array in ``buffer``.
    """

    def __init__(self, trees):
        levels, words, roots = _group_by_height(trees)
        self.num_levels = len(levels)
        self.num_nodes = len(words)
        arrays = {"words": np.asarray(words, dtype=np.float32),
                  "roots": np.asarray(roots, dtype=np.float32)}
        start = 0
        for lev, nodes in enumerate(levels):
            arrays["rows%d" % lev] = np.arange(start, start + len(nodes),
                                               dtype=np.float32)
            if lev > 0:
                arrays.update(_child_arrays(lev, nodes))
            start += len(nodes)
        self._pack(arrays)

    def _pack(self, arrays):
        """Concatenate ``arrays`` into ``self.buffer``; note offsets and shapes."""
        self.sizes, self.offsets = {}, {}
        pos = 0
        for name, arr in arrays.items():
            self.sizes[name] = arr.shape
            self.offsets[name] = pos
            pos += arr.size
        self.buffer = np.concatenate([a.ravel() for a in arrays.values()])

    def feed(self, ctx):
        """Copy the buffer to MXNet once; return a view per input name.

        Parameters
        ----------
        ctx : mxnet.Context

        Returns
        -------
        dict
            Input name -> NDArray view of the shape in ``sizes``.
        """
        flat = mx.nd.array(self.buffer, ctx=ctx, dtype=np.float32)
        views = {}
        for name, shape in self.sizes.items():
            begin = self.offsets[name]
            view = flat[begin:begin + int(np.prod(shape))]
            views[name] = view.reshape(shape) if len(shape) > 1 else view
        return views


def _heights(tree):
    """Return ``{id(node): height}`` for every node of a tree (leaf = 1)."""
    heights = {}
    for node in tree.postorder():
        heights[id(node)] = 1 + max((heights[id(c)] for c in node.children),
                                    default=0)
    return heights


def _group_by_height(trees):
    """Order all nodes by height; return (levels, words, root positions).

    ``levels[l]`` lists ``(node, children_positions)`` for nodes of height
    ``l + 1``, where positions are global row numbers in that order.
    """
    by_level = []
    for tree in trees:
        heights = _heights(tree)
        for node in tree.postorder():
            if node.word is None:
                raise ValueError("tree node %d has no word id" % node.index)
            lev = heights[id(node)] - 1
            while len(by_level) <= lev:
                by_level.append([])
            by_level[lev].append(node)
    position, words = {}, []
    for nodes in by_level:
        for node in nodes:
            position[id(node)] = len(words)
            words.append(node.word)
    levels = [[(node, [position[id(c)] for c in node.children])
               for node in nodes] for nodes in by_level]
    roots = [position[id(t)] for t in trees]
    return levels, words, roots


def _child_arrays(lev, nodes):
    """Child rows, parent positions and the 0/1 sum matrix of one level."""
    child, parent = [], []
    for pos, (_, children) in enumerate(nodes):
        child.extend(children)
        parent.extend([pos] * len(children))
    seg = np.zeros((len(nodes), len(child)), dtype=np.float32)
    seg[parent, np.arange(len(child))] = 1.0
    return {"child%d" % lev: np.asarray(child, dtype=np.float32),
            "parent%d" % lev: np.asarray(parent, dtype=np.float32),
            "seg%d" % lev: seg}


def build_symbol(num_levels, hidden, param_names):
    """The forward graph of a batch whose tallest tree has ``num_levels``.

    Parameters
    ----------
    num_levels : int
    hidden : int
        Memory size H.
    param_names : dict
        ``CELL_PARAMS`` entry -> the Parameter's full name (used as the
        variable name, so parameters can be fed by name).

    Returns
    -------
    mxnet.symbol.Symbol
        Output: root hidden states, shape (number of trees, H).
    """
    sym = mx.sym
    w = {key: sym.var(name) for key, name in param_names.items()}
    x_all = sym.FullyConnected(sym.take(sym.var("emb"), sym.var("words")),
                               w["x_weight"], w["x_bias"],
                               num_hidden=4 * hidden)
    table_h = table_c = None
    for lev in range(num_levels):
        x_lev = sym.take(x_all, sym.var("rows%d" % lev))
        h, c = _level(sym, lev, x_lev, table_h, table_c, w, hidden)
        if table_h is None:
            table_h, table_c = h, c
        else:
            table_h = sym.concat(table_h, h, dim=0)
            table_c = sym.concat(table_c, c, dim=0)
    return sym.take(table_h, sym.var("roots"))


def _level(sym, lev, x_lev, table_h, table_c, w, hidden):
    """Symbols ``(h, c)`` of all nodes of level ``lev``."""
    iou = sym.slice_axis(x_lev, axis=1, begin=0, end=3 * hidden)
    child_c_sum = None
    if lev > 0:
        child = sym.var("child%d" % lev)
        seg = sym.var("seg%d" % lev)
        child_h = sym.take(table_h, child)
        child_c = sym.take(table_c, child)
        iou = iou + sym.FullyConnected(sym.dot(seg, child_h),
                                       w["h_iou_weight"], no_bias=True,
                                       num_hidden=3 * hidden)
        x_f = sym.slice_axis(x_lev, axis=1, begin=3 * hidden, end=4 * hidden)
        f_h = sym.FullyConnected(child_h, w["h_f_weight"], no_bias=True,
                                 num_hidden=hidden)
        f = sym.Activation(f_h + sym.take(x_f, sym.var("parent%d" % lev)),
                           act_type="sigmoid")
        child_c_sum = sym.dot(seg, f * child_c)
    gates = [sym.Activation(sym.slice_axis(iou, axis=1, begin=k * hidden,
                                           end=(k + 1) * hidden),
                            act_type=act)
             for k, act in enumerate(("sigmoid", "sigmoid", "tanh"))]
    c = gates[0] * gates[2]
    if child_c_sum is not None:
        c = c + child_c_sum
    h = gates[1] * sym.Activation(c, act_type="tanh")
    return h, c


class HandBatchedTreeLSTM:
    """Batched forward of a Child-Sum Tree-LSTM sharing a cell's Parameters.

    Parameters
    ----------
    cell : examples.sick_model.ChildSumLSTMCell
        Initialised cell whose Parameters are used (not copied): gradients
        land in the same Parameters, so one Trainer updates both models.
    ctx : mxnet.Context, optional
        Defaults to the current context.

    Attributes
    ----------
    last : dict
        Figures of the last call: ``plan_ms`` (numpy index building),
        ``execute_ms`` (calling the CachedOp: launching MXNet work),
        ``compile_ms`` (the part of ``execute_ms`` spent building a new
        CachedOp and its first call, as in gluon_dynbatch's BatchStats),
        ``cache_hits``,
        ``cache_misses``, ``nodes``, ``levels``.
    """

    def __init__(self, cell, ctx=None):
        self.ctx = ctx or mx.current_context()
        self.hidden = cell.h_f_weight.shape[0]
        self.params = {key: getattr(cell, key) for key in CELL_PARAMS}
        self._ops = {}
        self.last = {}

    @property
    def num_compiled(self):
        """Number of distinct CachedOps built so far (one per level count)."""
        return len(self._ops)

    def _compile(self, num_levels):
        """Build the CachedOp for ``num_levels``; return (op, input names)."""
        names = {key: p.name for key, p in self.params.items()}
        sym = build_symbol(num_levels, self.hidden, names)
        inputs = sym.list_inputs()
        by_name = set(names.values())
        flags = [("data_indices",
                  [i for i, n in enumerate(inputs) if n not in by_name]),
                 ("param_indices",
                  [i for i, n in enumerate(inputs) if n in by_name]),
                 ("static_alloc", True), ("static_shape", True)]
        return mx.nd.CachedOp(sym, flags), inputs

    def __call__(self, trees, embeddings):
        """Root hidden states of ``trees``, one row each, in order.

        Parameters
        ----------
        trees : list of Tree
        embeddings : NDArray
            Embedding table (V, D); fed as data (no gradient is taken).

        Returns
        -------
        NDArray
            Shape (len(trees), H); recorded by autograd when recording.
        """
        t0 = time.perf_counter()
        plan = LevelPlan(trees)
        feed = plan.feed(self.ctx)
        feed["emb"] = embeddings
        t1 = time.perf_counter()
        entry = self._ops.get(plan.num_levels)
        hit = entry is not None
        if not hit:
            entry = self._ops[plan.num_levels] = self._compile(plan.num_levels)
        op, inputs = entry
        by_name = {p.name: p.data(self.ctx) for p in self.params.values()}
        by_name.update(feed)
        out = op(*[by_name[n] for n in inputs])
        t2 = time.perf_counter()
        execute_ms = 1000.0 * (t2 - t1)
        self.last = {"plan_ms": 1000.0 * (t1 - t0),
                     "execute_ms": execute_ms,
                     "compile_ms": 0.0 if hit else execute_ms,
                     "cache_hits": int(hit), "cache_misses": int(not hit),
                     "nodes": plan.num_nodes, "levels": plan.num_levels}
        return out
