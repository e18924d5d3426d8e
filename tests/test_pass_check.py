"""Every rewrite's result has the shapes MXNet gives the call as written.

A pass (``record/passes.py``) records a call in another form; what it returns
stands for the call's outputs.  A pass that returned other shapes would make
every later shape wrong, so its result is checked against MXNet's inference
for the call as written, once per call shape: a wrong pass is an internal
error naming the sample, the block, the call and both shapes.
"""
import contextlib

import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from gluon_dynbatch.ir import calls
from gluon_dynbatch.ir.ops import opdef
from gluon_dynbatch.record import passes
from dynbatch_testing import check_all_strategies, make_model

H = 4


@contextlib.contextmanager
def _registered(table, fn, name=None):
    """Pass ``fn`` registered (``BY_NAME[name]``, or appended to the list ``table``)
    for the duration."""
    if name is not None:
        before = table.get(name)
        table[name] = (fn,) + (before or ())
    else:
        table.insert(0, fn)
    try:
        yield
    finally:
        if name is None:
            table.remove(fn)
        elif before is None:
            del table[name]
        else:
            table[name] = before


def first_column_tanh(rec, op, args, kwargs):
    """A wrong pass: ``tanh`` of a (1, H) value recorded as the tanh of its first column."""
    x = args[0]
    if len(x.shape) != 2:
        return None
    column = rec.record_plain(opdef("slice_axis"), (x,), {"axis": 1, "begin": 0, "end": 1})
    return rec.call_op(op, (column,), kwargs)


class Tanh(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(H)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


def _rows(count, rows=1):
    rng = np.random.RandomState(0)
    return [nd.array(rng.uniform(-1, 1, (rows, 3))) for _ in range(count)]


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_a_pass_giving_other_shapes_is_an_internal_error(granularity):
    model = make_model(Tanh)
    with _registered(passes.BY_NAME, first_column_tanh, "tanh"):
        with pytest.raises(gdb.BatchingError,
                           match=r"sample 0, in tanh\d+ > tanh: internal error: the pass "
                                 r"first_column_tanh gave shapes \[\(1, 1\)\] where MXNet "
                                 r"gives \[\(1, 4\)\]"):
            with gdb.batching(granularity=granularity):
                [model(x) for x in _rows(3)]     # pylint: disable=expression-not-assigned
    with gdb.batching(granularity=granularity):    # without it, the same model runs
        outs = [model(x) for x in _rows(3)]
    assert all(out.shape == (1, H) for out in outs)


def test_a_pass_on_reshaped_values_giving_other_shapes_is_an_internal_error():
    def flattened(rec, op, args, kwargs):
        if op.name != "sigmoid":
            return None
        return rec.call_op(opdef("reshape"), (args[0],), {"shape": (-1,)})

    model = make_model(Tanh)
    with _registered(passes.ON_BASES, flattened):
        with pytest.raises(gdb.BatchingError, match=r"outside any sample, in top level > "
                                                    r"sigmoid: internal error: the pass "
                                                    r"flattened gave shapes \[\(4,\)\] where "
                                                    r"MXNet gives \[\(1, 1, 4\)\]"):
            with gdb.batching():
                value = model(_rows(1)[0]).expand_dims(0)      # a reshape: it has a base
                value.sigmoid()


def test_an_indexing_pass_giving_another_shape_is_an_internal_error():
    def whole(rec, x, begins, ends, shape, whole_rows):
        return x

    with _registered(passes.INDEXING, whole):
        with pytest.raises(gdb.BatchingError, match=r"indexing: internal error: the pass whole "
                                                    r"gave shape \(1, 1, 4\) where indexing "
                                                    r"gives \(1, 4\)"):
            with gdb.batching():
                model = make_model(Tanh)
                value = model(_rows(1)[0]).expand_dims(0)
                value[0]                            # pylint: disable=pointless-statement


class VectorDot(gdb.DynBatchBlock):
    """DyNet's style: ``F.dot(W, x)`` of 1-d vectors, which a pass records as a row
    product between reshapes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w = self.params.get("w", shape=(H, 3))

    def hybrid_forward(self, F, x, w):
        return F.tanh(F.dot(w, F.reshape(x, (-1,))))


def test_the_check_runs_once_per_call_shape_and_rewrites_stay_exact(monkeypatch):
    seen = []
    real = passes.written_shapes

    def counting(op, *args):
        seen.append(op.name)
        return real(op, *args)

    monkeypatch.setattr(passes, "written_shapes", counting)
    model = make_model(VectorDot)
    with gdb.batching():
        [model(x) for x in _rows(20)]                # pylint: disable=expression-not-assigned
    assert 1 <= seen.count("dot") <= 2
    seen.clear()
    with gdb.batching():
        [model(x) for x in _rows(20)]                # pylint: disable=expression-not-assigned
    assert "dot" not in seen
    check_all_strategies(model, _rows(5), [], strategies=("depth",))


def test_written_shapes_are_mxnets():
    x, w = nd.ones((1, 3)), nd.ones((H, 3))
    assert calls.written_shapes(opdef("dot"), (x, w), {"transpose_b": True}) == ((1, H),)
    with pytest.raises(gdb.BatchingError, match="sample 2, in m > dot: invalid call"):
        calls.written_shapes(opdef("dot"), (x, w), {}, 2, ("m",))
