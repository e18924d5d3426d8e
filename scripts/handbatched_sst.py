"""A hand-batched binary Tree-LSTM on SST: MXNet's practical limit on DyNet's benchmark.

The same math as :class:`examples.sst_model.BinaryTreeLSTM` (see that module),
on the same Parameters, written by hand for a whole batch of trees:

* nodes are grouped by height (pre-terminals have height 1), so both
  children of a node of height ``l`` lie in earlier levels;
* children are gathered from a *frontier*: the states computed so far whose
  parent has not run yet.  After each level the frontier keeps the rows still
  needed and appends the new ones, so no level reads (and no backward pass
  writes) a table of every state computed before it;
* numpy builds the index arrays of a batch (word ids, each level's children
  and kept rows, every node's label); they are packed into one float32
  buffer, copied to MXNet once, and fed as data through views;
* the forward pass and the summed loss of a batch are one symbolic graph run
  as one :class:`mxnet.nd.CachedOp`.  The graph only depends on the number of
  levels (and on which levels keep no rows), so one CachedOp per such shape
  serves every batch.

Two variants differ in how the word embeddings enter:

* *dense* (``HandBatchedSST(cell, ...)``, called with the (V, E) table): the
  CachedOp gathers the pre-terminals' rows with ``take``, so the table's
  gradient is a dense (V, E) array and Adam updates every row, as in the
  gluon_dynbatch models;
* *sparse* (``HandBatchedSST(cell, ..., embedding=sparse_embedding(table))``):
  an ``nn.Embedding(V, E, sparse_grad=True)`` looks the rows up outside the
  CachedOp and feeds them in as data, so the table's gradient is
  ``row_sparse`` and ``Trainer(..., "adam", {"lazy_update": True})`` updates
  only the rows a batch used, as DyNet does for its lookup parameters.  This
  is the like-for-like comparison with DyNet.

It answers one question for the benchmark against DyNet: how fast can MXNet
run this model when nothing is spent per tree node in Python?
"""
import mxnet as mx
import numpy as np
from mxnet.gluon import nn

#: Parameter attribute names of ``BinaryTreeLSTM``, in graph-input order.
CELL_PARAMS = ("leaf_iou_weight", "leaf_iou_bias", "iou_weight", "iou_bias",
               "forget_left_weight", "forget_right_weight", "forget_bias",
               "out_weight")


class SSTLevelPlan:
    """Index arrays of one batch of binary trees, grouped by node height.

    Rows are numbered level by level (all pre-terminals first); within a
    level, tree by tree in post-order.

    Parameters
    ----------
    trees : list of SSTTree
        Binary trees whose pre-terminals have ``word_id`` set.

    Attributes
    ----------
    num_levels : int
        Height of the tallest tree.
    num_nodes : int
        Nodes (pre-terminals and internal nodes) of all trees.
    sizes : dict
        Name of each graph input -> its length.
    buffer : numpy.ndarray
        All index arrays, concatenated (float32).
    """

    def __init__(self, trees):
        levels, parent_height = _group_by_height(trees)
        arrays = {"words": [n.word_id for n in levels[0]]}
        frontier = levels[0]          # nodes whose states the frontier holds, in order
        self.keeps = []               # per level >= 1: does the frontier keep rows?
        for lev, nodes in enumerate(levels[1:], start=1):
            pos = {id(n): k for k, n in enumerate(frontier)}
            arrays["left%d" % lev] = [pos[id(n.children[0])] for n in nodes]
            arrays["right%d" % lev] = [pos[id(n.children[1])] for n in nodes]
            kept = [n for n in frontier if parent_height[id(n)] > lev + 1]
            self.keeps.append(bool(kept))
            if kept:
                arrays["keep%d" % lev] = [pos[id(n)] for n in kept]
            frontier = kept + nodes
        arrays["labels"] = [n.label for nodes in levels for n in nodes]
        self.num_levels = len(levels)
        self.num_nodes = len(arrays["labels"])
        self.sizes = {name: len(values) for name, values in arrays.items()}
        self.buffer = np.concatenate([np.asarray(v, dtype=np.float32)
                                      for v in arrays.values()])

    def feed(self, ctx):
        """Copy the buffer to MXNet once; return a view per input name."""
        flat = mx.nd.array(self.buffer, ctx=ctx, dtype=np.float32)
        views, pos = {}, 0
        for name, size in self.sizes.items():
            views[name] = flat[pos:pos + size]
            pos += size
        return views


def _group_by_height(trees):
    """(levels, parent heights): ``levels[l]`` holds the nodes of height l + 1.

    The second maps ``id(node)`` to its parent's height (0 for a root).
    """
    levels, parent_height = [], {}
    for tree in trees:
        heights = {}
        parent_height[id(tree)] = 0
        for node in tree.postorder():
            if node.is_preterminal:
                height = 1
            else:
                if len(node.children) != 2:
                    raise ValueError("hand-batched SST needs binary trees, got a "
                                     "node with %d children" % len(node.children))
                height = 1 + max(heights[id(c)] for c in node.children)
            heights[id(node)] = height
            for child in node.children:
                parent_height[id(child)] = height
            while len(levels) < height:
                levels.append([])
            levels[height - 1].append(node)
    return levels, parent_height


def _gates(z, hidden):
    """Sigmoid i, sigmoid o, tanh u of gate pre-activations (rows, 3H)."""
    i = mx.sym.Activation(mx.sym.slice_axis(z, axis=1, begin=0, end=hidden),
                          act_type="sigmoid")
    o = mx.sym.Activation(mx.sym.slice_axis(z, axis=1, begin=hidden, end=2 * hidden),
                          act_type="sigmoid")
    u = mx.sym.Activation(mx.sym.slice_axis(z, axis=1, begin=2 * hidden,
                                            end=3 * hidden), act_type="tanh")
    return i, o, u


def build_symbol(keeps, hidden, num_classes, rows_fed=False):
    """The summed loss of a batch as one symbol.

    ``keeps[l - 1]`` says whether level ``l``'s frontier keeps earlier rows
    (``SSTLevelPlan.keeps``); the batch has ``len(keeps) + 1`` levels.  The
    pre-terminals' embeddings are gathered from the input ``embedding`` by
    ``words``, or with ``rows_fed`` come in looked up as the input ``rows``.
    """
    var = mx.sym.var
    w = {name: var(name) for name in CELL_PARAMS}
    if rows_fed:
        x = var("rows")
    else:
        x = mx.sym.take(var("embedding"), var("words"), axis=0)
    z = mx.sym.FullyConnected(x, w["leaf_iou_weight"], w["leaf_iou_bias"],
                              num_hidden=3 * hidden)
    i, o, u = _gates(z, hidden)
    cs = [i * u]
    hs = [o * mx.sym.Activation(cs[0], act_type="tanh")]
    h_front, c_front = hs[0], cs[0]
    for lev, keep in enumerate(keeps, start=1):
        left, right = var("left%d" % lev), var("right%d" % lev)
        h1, h2 = mx.sym.take(h_front, left), mx.sym.take(h_front, right)
        c1, c2 = mx.sym.take(c_front, left), mx.sym.take(c_front, right)
        z = mx.sym.FullyConnected(mx.sym.concat(h1, h2, dim=1), w["iou_weight"],
                                  w["iou_bias"], num_hidden=3 * hidden)
        i, o, u = _gates(z, hidden)
        f1 = mx.sym.Activation(mx.sym.FullyConnected(
            h1, w["forget_left_weight"], w["forget_bias"], num_hidden=hidden),
            act_type="sigmoid")
        f2 = mx.sym.Activation(mx.sym.FullyConnected(
            h2, w["forget_right_weight"], w["forget_bias"], num_hidden=hidden),
            act_type="sigmoid")
        c = i * u + f1 * c1 + f2 * c2
        cs.append(c)
        hs.append(o * mx.sym.Activation(c, act_type="tanh"))
        if keep:
            kept = var("keep%d" % lev)
            h_front = mx.sym.concat(mx.sym.take(h_front, kept), hs[-1], dim=0)
            c_front = mx.sym.concat(mx.sym.take(c_front, kept), cs[-1], dim=0)
        else:
            h_front, c_front = hs[-1], cs[-1]
    h_all = hs[0] if len(hs) == 1 else mx.sym.concat(*hs, dim=0)
    logits = mx.sym.FullyConnected(h_all, w["out_weight"], no_bias=True,
                                   num_hidden=num_classes)
    picked = mx.sym.pick(mx.sym.log_softmax(logits, axis=1), var("labels"), axis=1)
    return -mx.sym.sum(picked, keepdims=True).reshape((1,))


def sparse_embedding(table, ctx=None):
    """An ``nn.Embedding`` with a ``row_sparse`` gradient, initialised to ``table``.

    Parameters
    ----------
    table : NDArray
        (V, E) initial embeddings (copied).
    ctx : mxnet.Context, optional
        Defaults to ``table``'s context.

    Returns
    -------
    mxnet.gluon.nn.Embedding
    """
    vocab_size, embed_size = table.shape
    block = nn.Embedding(vocab_size, embed_size, sparse_grad=True)
    block.initialize(ctx=ctx or table.context)
    block.weight.set_data(table.copy())
    return block


class HandBatchedSST:
    """Summed loss of a batch of SST trees, hand-batched, on a model's Parameters.

    Parameters
    ----------
    cell : examples.sst_model.BinaryTreeLSTM
        Its Parameters are used (and trained) directly (an
        ``OpByOpBinaryTreeLSTM`` has the same ones).
    hidden, num_classes : int
        Sizes H and K of the model.
    ctx : mxnet.Context
    embedding : mxnet.gluon.nn.Embedding, optional
        Look the pre-terminals' rows up with this block outside the CachedOp
        (see :func:`sparse_embedding`); by default the CachedOp gathers them
        from the table passed to each call.
    """

    def __init__(self, cell, hidden, num_classes, ctx, embedding=None):
        self.cell = cell
        self.hidden, self.num_classes = hidden, num_classes
        self.ctx = ctx
        self.embedding = embedding
        self._ops = {}            # plan shape (keeps) -> (CachedOp, input names)

    def _op(self, keeps):
        found = self._ops.get(keeps)
        if found is None:
            symbol = build_symbol(keeps, self.hidden, self.num_classes,
                                  rows_fed=self.embedding is not None)
            names = symbol.list_inputs()
            params = [k for k, n in enumerate(names) if n in CELL_PARAMS + ("embedding",)]
            flags = [("static_alloc", True), ("param_indices", params),
                     ("data_indices", [k for k in range(len(names)) if k not in params])]
            found = self._ops[keeps] = (mx.nd.CachedOp(symbol, flags), names)
        return found

    def __call__(self, trees, embeddings=None):
        """The (1,) summed loss of ``trees`` (recorded when autograd records).

        ``embeddings`` is the (V, E) table; it is not used (and may be
        omitted) when the model has its own ``embedding`` block.
        """
        plan = SSTLevelPlan(trees)
        inputs = plan.feed(self.ctx)
        if self.embedding is not None:
            inputs["rows"] = self.embedding(inputs["words"])
        elif embeddings is None:
            raise ValueError("HandBatchedSST without an embedding block needs "
                             "the embedding table")
        else:
            inputs["embedding"] = embeddings
        for name in CELL_PARAMS:
            inputs[name] = getattr(self.cell, name).data(self.ctx)
        op, names = self._op(tuple(plan.keeps))
        return op(*[inputs[n] for n in names])
