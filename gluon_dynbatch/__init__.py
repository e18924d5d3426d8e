"""gluon_dynbatch: automatic dynamic batching for MXNet Gluon.

Write the forward pass of a :class:`DynBatchBlock` for one sample; inside a
:func:`batching` scope the calls of many samples are recorded, batched and
run together, with outputs and gradients equal to one-sample-at-a-time runs.

The pipeline, one subpackage per stage, in the order the data passes:
``record`` (calls as written become a graph), ``rewrite`` (passes over calls
as written), ``templates`` (a frame's calls become program nodes), ``rules``
(how nodes batch), ``plan`` (nodes grouped into steps), ``run`` (steps as
batched MXNet calls); ``ir`` holds what they share.  ``block`` and ``scope``
are the entry points; ``distributed`` launches data-parallel jobs.
"""
from . import rewrite as _rewrite  # noqa: F401  (registers the passes over calls)
from . import rules as _rules  # noqa: F401  (registers the batching rules)
from .block import DynBatchBlock
from .errors import BatchingError
from .record.lazy import LazyArray
from .scope import STRATEGIES, BatchingScope, batching, map  # pylint: disable=redefined-builtin
from .ir.rules import register_rule
from .stats import BatchStats

__all__ = ["DynBatchBlock", "batching", "map", "BatchingScope", "BatchingError", "BatchStats",
           "LazyArray", "STRATEGIES", "register_rule"]
__version__ = "0.1.0"
