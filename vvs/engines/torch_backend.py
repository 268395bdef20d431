"""The torch backend: a family's graph modules (the same ``nn.Module`` s its exporter exports), run eagerly on
CPU or CUDA behind the :class:`~vvs.engines.base.Engine` interface."""
from __future__ import annotations

import torch
from torch import nn

from vvs.export.spec import GraphSpec


class TorchEngine:
    def __init__(self, module: nn.Module, spec: GraphSpec):
        self.module, self.spec = module, spec

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        self.spec.check_inputs(inputs)
        with torch.inference_mode():
            outputs = self.module(*(inputs[name] for name in self.spec.input_names))
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return dict(zip(self.spec.output_names, outputs))
