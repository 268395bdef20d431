"""INT8 for the target: SmoothQuant W8A8 with explicit QuantizeLinear/DequantizeLinear.

1. Calibration data comes from the model itself: token sequences sampled from the target (vanilla AR with
   guidance, the distribution it will see when serving), for a spread of classes or prompts (the architecture's
   ``TargetArch.calibration``), with their guidance nulls. Per linear layer we record the per-input-channel
   absolute maximum of its activations. The result is cached in a small safetensors file.
2. SmoothQuant (alpha = 0.5) moves activation outliers into the weights, wherever the division by ``s`` can be
   folded exactly into the producer of the activation (an :class:`Int8Layout` names them per architecture): the
   query/key/value and gate/up projections (inputs straight from an RMSNorm: divide the norm weight) and the down
   projection (input ``silu(gate x) * (up x)``: divide the rows of ``up``); the consuming weight's columns are
   multiplied by ``s``. The attention output is not smoothed: folding into the value rows would change what the KV
   cache holds, and graphs of every precision must read the same cache.
3. Every linear layer of the blocks becomes ``QDQLinear``: activations per-tensor, weights per-output-channel,
   symmetric int8 with zero point 0 (TensorRT accepts nothing else). Attention, norms, RoPE and the output head
   stay in floating point (fp16, as in the fp16 export); so does the drafter (quantising it lowers acceptance).

Torch's fake-quantisation ops export as ONNX QuantizeLinear/DequantizeLinear with int8 zero points, so the
quantized torch module is both the reference and the export source.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn

if TYPE_CHECKING:
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.target import DiscreteTarget


@dataclass(frozen=True)
class Int8Layout:
    """Where SmoothQuant finds a target's block linears (names relative to a block)."""

    blocks: str  # the block list's module path in the target
    normed: tuple[tuple[str, tuple[str, ...]], ...]  # (an RMSNorm, the linears that read its output)
    gated: tuple[str, str]  # (up, down): down reads silu(gate x) * (up x)
    unsmoothed: tuple[str, ...]  # quantized, not smoothed (the attention output)

    @property
    def quantized(self) -> tuple[str, ...]:
        return (*(n for _, linears in self.normed for n in linears), *self.gated[1:], *self.unsmoothed)

    def key(self, block: int, name: str) -> str:
        """A linear's full module name: the calibration statistics' key."""
        return f"{self.blocks}.{block}.{name}"


LLAMA_INT8 = Int8Layout(
    "language_model.model.layers",
    (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
     ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))),
    ("mlp.up_proj", "mlp.down_proj"), ("self_attn.o_proj",))


def _onnx_op(op: str, inputs: tuple, dtype: torch.dtype, shape, axis: int | None = None) -> torch.Tensor:
    return torch.onnx.ops.symbolic(op, inputs, {} if axis is None else {"axis": axis}, dtype=dtype, shape=shape,
                                   version=23)


class QDQLinear(nn.Module):
    """``y = DQ(Q(x)) @ DQ(W_int8).T``: activations per tensor, weights per output row, int8, zero point 0.

    Eagerly it computes the same thing with torch ops; under ONNX export it emits QuantizeLinear and
    DequantizeLinear with explicit int8 zero points (torch's fake-quant ops do not export with dynamic shapes).
    """

    def __init__(self, linear: nn.Linear, act_absmax: float):
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("weight_scale", scale.float())
        self.register_buffer("act_scale", torch.tensor(max(act_absmax, 1e-8) / 127.0))
        self.register_buffer("zero_point", torch.zeros((), dtype=torch.int8))
        self.register_buffer("weight_zero_point", torch.zeros(w.shape[0], dtype=torch.int8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            q = _onnx_op("QuantizeLinear", (x, self.act_scale, self.zero_point), torch.int8, x.shape)
            xq = _onnx_op("DequantizeLinear", (q, self.act_scale, self.zero_point), x.dtype, x.shape)
            w = _onnx_op("DequantizeLinear", (self.weight_int8, self.weight_scale, self.weight_zero_point),
                         x.dtype, self.weight_int8.shape, axis=0)
        else:
            # ONNX Runtime quantizes fp16 activations in fp32; rounding in fp16 would flip some int8 values
            scale = self.act_scale.float()
            xq = (torch.clamp(torch.round(x.float() / scale), -128, 127) * scale).to(x.dtype)
            w = self.weight_int8.to(x.dtype) * self.weight_scale[:, None].to(x.dtype)
        return xq @ w.t()


@torch.no_grad()
def activation_absmax(target: DiscreteTarget, layout: Int8Layout, condition: torch.Tensor, tokens: torch.Tensor,
                      mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Per-input-channel |activation| maxima of every quantized linear layer over the teacher-forced rows
    ``condition ‖ tokens`` (conditional and null rows alike)."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    blocks = target.get_submodule(layout.blocks)
    for i, block in enumerate(blocks):
        for name in layout.quantized:
            def hook(mod, args, _out, key=layout.key(i, name)):
                m = args[0].detach().abs().flatten(0, -2).amax(0)
                stats[key] = torch.maximum(stats[key], m) if key in stats else m
            hooks.append(block.get_submodule(name).register_forward_hook(hook))
    try:
        target.teacher_forced(condition, tokens, mask)
    finally:
        for h in hooks:
            h.remove()
    return stats


def calibrate(bundle: ModelBundle, cache: Path | None, num: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    """Activation statistics, read from ``cache`` when it exists, else measured and written there."""
    if cache is not None and Path(cache).is_file():
        return load_file(cache)
    arch = bundle.arch
    stats = activation_absmax(bundle.target, arch.int8, *arch.calibration(bundle, num, seed))
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in stats.items()}, cache)
    return stats


def _smoothing(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0).clamp_min(1e-5)
    return (act_absmax.clamp_min(1e-5) ** alpha / w_max ** (1 - alpha)).clamp(1e-2, 1e2)


@torch.no_grad()
def quantize_target(target: DiscreteTarget, layout: Int8Layout, stats: dict[str, torch.Tensor],
                    alpha: float = 0.5) -> DiscreteTarget:
    """A copy of ``target`` with SmoothQuant applied and every block linear replaced by :class:`QDQLinear`."""
    q = copy.deepcopy(target).eval()
    absmax = {k: v.clone() for k, v in stats.items()}
    for i, block in enumerate(q.get_submodule(layout.blocks)):
        key = lambda name: layout.key(i, name)  # noqa: E731
        for norm_name, names in layout.normed:  # inputs straight from an RMSNorm: divide its weight
            linears = [block.get_submodule(n) for n in names]
            s = _smoothing(absmax[key(names[0])], [m.weight for m in linears], alpha)
            block.get_submodule(norm_name).weight.div_(s)
            for m, n in zip(linears, names):
                m.weight.mul_(s)
                absmax[key(n)] = absmax[key(n)] / s
        up_name, down_name = layout.gated  # down reads silu(gate x) * (up x), linear in up x: divide up's rows
        up, down = block.get_submodule(up_name), block.get_submodule(down_name)
        s = _smoothing(absmax[key(down_name)], [down.weight], alpha)
        up.weight.div_(s[:, None])
        down.weight.mul_(s)
        absmax[key(down_name)] = absmax[key(down_name)] / s
        for n in layout.quantized:
            parent, _, leaf = n.rpartition(".")
            owner = block.get_submodule(parent)
            setattr(owner, leaf, QDQLinear(getattr(owner, leaf), float(absmax[key(n)].max())))
    return q


def int8_bundle(bundle: ModelBundle, stats: dict[str, torch.Tensor]) -> ModelBundle:
    return replace(bundle, target=quantize_target(bundle.target, bundle.arch.int8, stats))
