"""Where rewrites plug into recording: passes over calls as the user wrote them.

Every intercepted call (an ``F`` operator, an ``mx.nd`` operator called on a
pending value, a LazyArray's arithmetic, fluent method or indexing) reaches
``Recorder.record`` as written.  Unless the scope runs the reference
strategy, the passes registered here may record it in another form that
batches better (``gluon_dynbatch.rewrite`` registers them when the package
is imported); the first that applies gives the call's outputs.  A pass is

    ``fn(rec, op, args, kwargs) -> outputs or None``

recording whatever it records through ``rec`` (``rec.call_op`` for calls
kept as they are, ``rec.record`` for calls that may be rewritten again), and
returning None when it does not apply, having recorded nothing.  Every form a
pass records computes the values and gradients of the call as written, to
float32 rounding.

* ``BY_NAME``: passes for an operator, by its name;
* ``ON_BASES``: passes for any call whose first array (or, of two, second) is
  the reshape of another pending value (``bases.py``);
* ``INDEXING``: passes for ``x[...]`` of such a value:
  ``fn(rec, x, begins, ends, shape, whole_rows) -> value or None``;
* ``SLICES``: passes for a slice of a value of the recording frame along one
  axis: ``fn(rec, x, axis, begin, end) -> value or None``.

What a pass returns is checked (``checked``, ``checked_index``): its shapes
must be those MXNet gives the call as written, else an internal error names
the sample, the block, the call and both shapes.  The check costs a lookup
once the call shape has been checked; in a frame it runs when the frame
learns what the pass recorded (``Frame.written``), not when later frames
replay it.
"""
from mxnet.ndarray import NDArray

from ..errors import BatchingError, describe_call
from ..ir.calls import written_shapes

BY_NAME = {}        # operator name -> tuple of passes, in the order registered
APPLIES = {}        # operator name -> when any of its passes may apply (``applies``)
ON_BASES = []       # passes for calls reading a reshaped value
INDEXING = []       # passes for indexing a reshaped value
SLICES = []         # passes for a slice of a frame's value along one axis
_CHECKED = set()    # call shapes whose passes' results have the right shapes
MAX_CHECKED = 100000


def register(names, fn, when=None):
    """Run pass ``fn`` on calls of the operators ``names`` (a name or a list).

    ``when(args, kwargs)``, if given, is a cheap test that is False for the
    calls ``fn`` leaves as written (``fn`` returns None): those take the
    recorder's short path for calls no pass rewrites (``applies``).
    """
    for name in [names] if isinstance(names, str) else names:
        BY_NAME[name] = BY_NAME.get(name, ()) + (fn,)
        tests = APPLIES.get(name, ())
        APPLIES[name] = None if tests is None or when is None else tests + (when,)


def applies(name):
    """For the calls of operator ``name``: True when no pass rewrites them, a
    test of ``(args, kwargs)`` when every pass of it said which calls it may
    rewrite (True for those), else False (any call may be rewritten)."""
    if name not in BY_NAME:
        return True
    tests = APPLIES.get(name)
    if not tests:
        return False
    if len(tests) == 1:
        return tests[0]
    return lambda args, kwargs: any(test(args, kwargs) for test in tests)


def register_on_bases(fn):
    """Run pass ``fn`` on calls whose first (or second) array has a base."""
    ON_BASES.append(fn)


def register_indexing(fn):
    """Run pass ``fn`` on ``x[...]`` of a value with a base."""
    INDEXING.append(fn)


def register_slices(fn):
    """Run pass ``fn`` on slices of the recording frame's values along one axis."""
    SLICES.append(fn)


def sliced(rec, x, axis, begin, end):
    """``x`` sliced along ``axis`` by the first pass of ``SLICES`` that applies
    (its shape checked), or None."""
    if rec.faithful():
        return None
    for fn in SLICES:
        found = fn(rec, x, axis, begin, end)
        if found is not None:
            # (``end`` None or bounds from the end count as MXNet counts them)
            first, last, _ = slice(begin, end).indices(x.shape[axis])
            shape = x.shape[:axis] + (max(last - first, 0),) + x.shape[axis + 1:]
            return checked_index(rec, fn, x, shape, found)
    return None


def checked(rec, fn, op, args, kwargs, found):
    """``found``, what pass ``fn`` returned for ``op(*args, **kwargs)``, once its
    shapes are those MXNet infers for the call as written."""
    got = _shapes(found)
    try:
        key = (op, fn, tuple((a.shape, a.dtype) if isinstance(a, NDArray) else a for a in args),
               tuple((k, (v.shape, v.dtype) if isinstance(v, NDArray) else v)
                     for k, v in kwargs.items()), got)
        if key in _CHECKED:
            return found
    except TypeError:           # an unhashable constant: checked every time
        key = None
    want = written_shapes(op, args, kwargs, rec.sample, rec.path)
    if want is not None and tuple(want) != got:
        raise BatchingError(
            "%s: internal error: the pass %s gave shapes %s where MXNet gives %s for the call "
            "as written, on input shapes %s" % (
                describe_call(rec.sample, rec.path, op.name), fn.__name__, list(got),
                list(want), [a.shape for a in args if isinstance(a, NDArray)]))
    if key is not None and len(_CHECKED) < MAX_CHECKED:
        _CHECKED.add(key)
    return found


def checked_index(rec, fn, x, shape, found):
    """``found``, what pass ``fn`` returned for ``x[...]``, once its shape is
    ``shape``, the one MXNet's indexing gives."""
    if tuple(found.shape) != tuple(shape):
        raise BatchingError(
            "%s: internal error: the pass %s gave shape %s where indexing gives %s, on "
            "input shape %s" % (describe_call(rec.sample, rec.path, "indexing"), fn.__name__,
                                found.shape, tuple(shape), x.shape))
    return found


def _shapes(found):
    """The output shapes of a pass's result: one array, or a list of them."""
    if isinstance(found, (list, tuple)):
        return tuple(tuple(a.shape) for a in found)
    return (tuple(found.shape),)
