"""Rewrites: calls as the user wrote them, recorded in forms that batch better.

Enters: a call as written (an operator, its arguments, its keywords) that
``record.Recorder.record`` is recording, unless the scope runs the reference
strategy.
Leaves: the call's outputs, recorded through the recorder in another form
with the same values and gradients (to float32 rounding), or nothing (None),
and the call is recorded as written.

Each module registers its passes with ``record.passes`` when imported:

* ``reshapes``: reshapes of pending values seen through (splits, slices,
  stacks and reshapes of a reshaped value read rows of its base);
* ``rows``: splits, stacks and transposes that only move rows, as row views;
* ``dots``: DyNet-style products of 1-d vectors, attention scores;
* ``columns``: attention over a sample's own rows in column form;
* ``pairs`` (and the operators of ``matrix_ops``): a sample's own matrices as
  columns of their entries;
* ``literals``: takes by known indices as row views, ``arange_like`` as a literal;
* ``positions``: slices at positions of a sample's own, the position as a literal;
* ``workarounds``: forms that avoid MXNet 1.9.1's errors inside CachedOps.
"""
from . import reshapes  # noqa: F401  (first: a split of a reshaped value reads its base)
from . import rows  # noqa: F401
from . import dots  # noqa: F401
from . import columns  # noqa: F401
from . import pairs  # noqa: F401
from . import literals  # noqa: F401
from . import positions  # noqa: F401
from . import workarounds  # noqa: F401
