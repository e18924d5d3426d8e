"""gluon_dynbatch: automatic dynamic batching for MXNet Gluon.

Write the forward pass of a :class:`DynBatchBlock` for one sample; inside a
:func:`batching` scope the calls of many samples are recorded, batched and
run together, with outputs and gradients equal to one-sample-at-a-time runs.

The pipeline, one module per stage, in the order the data flows:

* recording: ``block`` (calls intercepted), ``scope`` (the scope, its flush),
  ``lazy`` and ``lazy_ops`` (values), ``context``, ``namespace`` (the
  recording ``F``), ``recorder`` (graph nodes), ``weight_calls`` (calls on
  weights only, once per graph), ``calls`` and ``ops`` (what
  a call is), ``frames`` and ``trie`` (a call of a block recorded as a path
  of learned templates), ``sites`` (loops in the user's code);
* templates: ``vectorize`` (repeated calls on stacked rows), ``templates``
  (a frame's calls become program or operator nodes), ``programs`` (the
  sub-program node);
* the graph and its plan: ``graph``, ``rules`` and ``layer_rules``
  (batching rules and signatures), ``plan`` and ``budget`` (steps, within an analysis budget);
* running: ``lower`` (gathers and steps), ``run`` (executors), ``cache``;
  ``reference`` runs node by node, the oracle of the tests.
"""
from . import lazy_ops as _lazy_ops  # noqa: F401  (installs LazyArray operators)
from . import layer_rules as _layer_rules  # noqa: F401  (registers RNN and transpose rules)
from . import groups as _groups  # noqa: F401  (registers the rule of group operators)
from .block import DynBatchBlock
from .errors import BatchingError
from .lazy import LazyArray
from .scope import STRATEGIES, BatchingScope, batching
from .rules import register_rule
from .stats import BatchStats

__all__ = ["DynBatchBlock", "batching", "BatchingScope", "BatchingError", "BatchStats",
           "LazyArray", "STRATEGIES", "register_rule"]
__version__ = "0.1.0"
