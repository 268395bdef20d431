"""INT8 for the target: SmoothQuant W8A8 with explicit QuantizeLinear/DequantizeLinear.

1. Calibration data comes from the model itself: token sequences sampled from the target (vanilla AR with
   guidance, the distribution it will see when serving), for a spread of classes. Per linear layer we record the
   per-input-channel absolute maximum of its activations. The result is cached in a small safetensors file.
2. SmoothQuant (alpha = 0.5) moves activation outliers into the weights, wherever the division by ``s`` can be
   folded exactly into the producer of the activation: ``wqkv`` and ``w1``/``w3`` (inputs straight from an
   RMSNorm: divide the norm weight) and ``w2`` (input ``silu(w1 x) * (w3 x)``: divide the rows of ``w3``); the
   consuming weight's columns are multiplied by ``s``. ``wo`` is not smoothed: folding into the value rows would
   change what the KV cache holds, and graphs of every precision must read the same cache.
3. Every linear layer of the blocks becomes ``QDQLinear``: activations per-tensor, weights per-output-channel,
   symmetric int8 with zero point 0 (TensorRT accepts nothing else). Attention, norms, RoPE and the output head
   stay in floating point (fp16, as in the fp16 export); so does the drafter (quantising it lowers acceptance).

Torch's fake-quantisation ops export as ONNX QuantizeLinear/DequantizeLinear with int8 zero points, so the
quantized torch module is both the reference and the export source.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vvs.families.llamagen.bundle import ModelBundle
from vvs.families.llamagen.gpt import GPT, sample_ar

QUANTIZED = ("attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w3", "feed_forward.w2")


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


def calibration_tokens(bundle: ModelBundle, num: int, seed: int, cfg_scale: float = 3.0):
    """``num`` sequences sampled from the target itself (AR with guidance), classes spread evenly."""
    labels = torch.arange(num) % bundle.target.config.num_classes
    return labels, sample_ar(bundle.target, labels, cfg_scale, generator=torch.Generator().manual_seed(seed),
                             progress="calibrate")


@torch.no_grad()
def activation_absmax(target: GPT, labels: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-input-channel |activation| maxima of every quantized linear layer (conditional and null classes)."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in target.named_modules():
        if name.endswith(QUANTIZED):
            def hook(mod, args, _out, name=name):
                m = args[0].detach().abs().flatten(0, -2).amax(0)
                stats[name] = torch.maximum(stats[name], m) if name in stats else m
            hooks.append(module.register_forward_hook(hook))
    try:
        null = torch.full_like(labels, target.config.null_class)
        target.teacher_forced(torch.cat([labels, null]), torch.cat([tokens[:, :-1], tokens[:, :-1]]))
    finally:
        for h in hooks:
            h.remove()
    return stats


def calibrate(bundle: ModelBundle, cache: Path | None, num: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    """Activation statistics, read from ``cache`` when it exists, else measured and written there."""
    if cache is not None and Path(cache).is_file():
        return load_file(cache)
    labels, tokens = calibration_tokens(bundle, num, seed)
    stats = activation_absmax(bundle.target, labels, tokens)
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in stats.items()}, cache)
    return stats


def _smoothing(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0).clamp_min(1e-5)
    return (act_absmax.clamp_min(1e-5) ** alpha / w_max ** (1 - alpha)).clamp(1e-2, 1e2)


@torch.no_grad()
def quantize_target(target: GPT, stats: dict[str, torch.Tensor], alpha: float = 0.5) -> GPT:
    """A copy of ``target`` with SmoothQuant applied and every block linear replaced by :class:`QDQLinear`."""
    q = copy.deepcopy(target).eval()
    absmax = {k: v.clone() for k, v in stats.items()}
    for i, layer in enumerate(q.layers):
        attn, ffn = layer.attention, layer.feed_forward
        key = lambda name: f"layers.{i}.{name}"  # noqa: E731
        # inputs straight from an RMSNorm: divide its weight
        for norm, linears in ((layer.attention_norm, (attn.wqkv,)), (layer.ffn_norm, (ffn.w1, ffn.w3))):
            names = [n for n in QUANTIZED if layer.get_submodule(n) in linears]
            s = _smoothing(absmax[key(names[0])], [m.weight for m in linears], alpha)
            norm.weight.div_(s)
            for m, n in zip(linears, names):
                m.weight.mul_(s)
                absmax[key(n)] = absmax[key(n)] / s
        # w2 reads silu(w1 x) * (w3 x), linear in w3 x: divide the rows of w3
        s = _smoothing(absmax[key("feed_forward.w2")], [ffn.w2.weight], alpha)
        ffn.w3.weight.div_(s[:, None])
        ffn.w2.weight.mul_(s)
        absmax[key("feed_forward.w2")] = absmax[key("feed_forward.w2")] / s
        for n in QUANTIZED:
            parent, _, leaf = n.rpartition(".")
            owner = layer.get_submodule(parent)
            setattr(owner, leaf, QDQLinear(getattr(owner, leaf), float(absmax[key(n)].max())))
    return q


def int8_bundle(bundle: ModelBundle, stats: dict[str, torch.Tensor]) -> ModelBundle:
    return ModelBundle(quantize_target(bundle.target, stats), bundle.drafter, bundle.vq)
