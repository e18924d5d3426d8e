"""gluon_dynbatch: automatic dynamic batching for MXNet Gluon.

Write the forward pass of a :class:`DynBatchBlock` for one sample; inside a
:func:`batching` scope the calls of many samples are recorded, batched and
run together, with outputs and gradients equal to one-sample-at-a-time runs.
"""
from .block import DynBatchBlock
from .scope import batching

__all__ = ["DynBatchBlock", "batching"]
__version__ = "0.1.0"
