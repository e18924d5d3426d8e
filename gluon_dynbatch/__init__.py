"""gluon_dynbatch: automatic dynamic batching for MXNet Gluon.

Write the forward pass of a :class:`DynBatchBlock` for one sample; inside a
:func:`batching` scope the calls of many samples are recorded, batched and
run together, with outputs and gradients equal to one-sample-at-a-time runs.

The pipeline, one module per stage: ``record`` (calls -> nodes; ``replay``
copies traced child-block calls, ``calls`` makes a call that batches row by
row one node) -> ``graph`` (the recorded nodes) -> ``signatures`` (batching
rules) -> ``plan`` (steps) -> ``execute`` and ``compile`` (batched MXNet
calls, CachedOps); ``reference`` runs node by node as the oracle.
"""
from . import lazy_ops as _lazy_ops  # noqa: F401  (installs LazyArray operators)
from .block import DynBatchBlock
from .errors import BatchingError
from .lazy import LazyArray
from .plan import STRATEGIES
from .scope import BatchingScope, batching
from .signatures import register_rule
from .stats import BatchStats

__all__ = ["DynBatchBlock", "batching", "BatchingScope", "BatchingError", "BatchStats",
           "LazyArray", "STRATEGIES", "register_rule"]
__version__ = "0.1.0"
