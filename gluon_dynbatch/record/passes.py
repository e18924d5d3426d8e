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
  ``fn(rec, x, begins, ends, shape, whole_rows) -> value or None``.
"""

BY_NAME = {}        # operator name -> tuple of passes, in the order registered
ON_BASES = []       # passes for calls reading a reshaped value
INDEXING = []       # passes for indexing a reshaped value


def register(names, fn):
    """Run pass ``fn`` on calls of the operators ``names`` (a name or a list)."""
    for name in [names] if isinstance(names, str) else names:
        BY_NAME[name] = BY_NAME.get(name, ()) + (fn,)


def register_on_bases(fn):
    """Run pass ``fn`` on calls whose first (or second) array has a base."""
    ON_BASES.append(fn)


def register_indexing(fn):
    """Run pass ``fn`` on ``x[...]`` of a value with a base."""
    INDEXING.append(fn)
