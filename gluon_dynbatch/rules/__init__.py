"""Rules: how recorded calls batch, one module per family of operators.

Enters: a recorded node (its operator, constants, input shapes and dtypes,
where its inputs come from), asked by ``ir.calls.analyse`` through the
registry of ``ir.rules``.
Leaves: the node's signature (which other nodes it may run with) and roles
of its inputs; later, for a step of such nodes, the batched MXNet call on
their gathered inputs (``batched_call``) and the index arrays it reads.

Each module registers its rules with ``ir.rules.register_rule`` when
imported: ``rows`` (row by row, views), ``segments`` (ragged reductions and
softmaxes over a node's rows), ``reductions`` (over every axis), ``products``
(matrix products), ``gathers`` (takes), ``broadcasts``, ``losses``,
``layers`` (fused RNNs, transposes) and ``groups`` (a sample's own matrices
held as columns).
"""
from . import rows  # noqa: F401  (first: the others build on its rules)
from . import segments  # noqa: F401
from . import reductions  # noqa: F401
from . import products  # noqa: F401
from . import gathers  # noqa: F401
from . import broadcasts  # noqa: F401
from . import losses  # noqa: F401
from . import layers  # noqa: F401
from . import groups  # noqa: F401
from . import linalg  # noqa: F401
# What a rule for ``register_rule`` is built from.
from ..ir.rules import (ALONE, BROW, KNOWN, ROW, SHARED, Rule, Signature,  # noqa: F401,E402
                        register_rule, rule_for)
from .rows import (RowFallback, RowRule, ReshapeRule, ViewRule, all_row_roles,  # noqa: F401,E402
                   axis_roles, elementwise_roles, first_row_roles)
from .segments import SegmentRule  # noqa: F401,E402
