"""DynBatchBlock (skeleton: eager only, replaced by the engine)."""
import mxnet as mx
from mxnet import gluon


class DynBatchBlock(gluon.HybridBlock):
    def __init__(self, strategy="agenda", analysis_budget=None, **kwargs):
        super().__init__(**kwargs)
        self._strategy = strategy
        self._analysis_budget = analysis_budget

    def forward(self, *args):
        ctx = mx.current_context()
        params = {name: p.data(ctx) for name, p in self._reg_params.items()}
        return self.hybrid_forward(mx.nd, *args, **params)
