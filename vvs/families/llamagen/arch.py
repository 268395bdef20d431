"""What a discrete-token target architecture gives the LlamaGen machinery (graphs, exporter, engine sets), so
that one exporter and one loop serve every such family: LlamaGen's GPT here, Janus-Pro's generation path in
:mod:`vvs.families.janus_pro.arch`. A family names its record in its registry entry (``Family.target_arch``).

A target module offers ``config`` (``vocab_size``, ``sampled_ids``, ``cls_token_num``, ``num_image_tokens``,
``max_positions``, ``grid_size``, ``dim``, ``n_layer``, ``n_head``, ``head_dim``, ``ffn_hidden``,
``condition_input(act)``, ``rotary()``), ``forward(tokens= | condition=, position_ids, mask, past_kv)`` returning
:class:`~vvs.families.llamagen.gpt.GPTOutput`, ``teacher_forced``, ``head`` and ``embedding_table()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from vvs.calib.int8 import Int8Layout
from vvs.families.llamagen.conditions import conditioning
from vvs.families.llamagen.gpt import GPT, GPTConfig, sample_ar
from vvs.families.llamagen.loading import load_gpt


@dataclass(frozen=True)
class TargetArch:
    family: str  # the manifest's model.family
    kind: str  # the kind recorded in the target's vvs safetensors file
    config: type  # its config dataclass
    load: Callable[[Path], nn.Module]  # a vvs target file -> the target, in eval mode
    # (config, tables, manifest's "model" entry, the folder's or bundle's text tokenizer) -> its Conditioning;
    # tables holds a t2i target's "null_condition"
    conditioning: Callable[..., object]
    int8: Int8Layout | None = None  # where SmoothQuant finds its block linears (vvs-export --precision int8)
    # (bundle, num, seed) -> (condition rows, token rows, mask or None): teacher-forced calibration data, sampled from
    # the target with guidance, nulls included (vvs.calib.int8)
    calibration: Callable[..., tuple] | None = None
    model: type | None = None  # the target's module class (built from a config)
    # vvs-bench --scale: a module with SIZES and inflated_config / inflate_bundle(small, size, n_layer)
    inflation: str | None = None


def _conditioning(config: GPTConfig, tables: dict, model_info: dict, tokenizer: Path | None):
    return conditioning(config, tables.get("null_condition"), model_info.get("classes", ()))


def _calibration(bundle, num: int, seed: int):
    """Class ids spread evenly, each sampled with guidance 3, and the null class's rows."""
    target = bundle.target
    labels = torch.arange(num) % target.config.num_classes
    tokens = sample_ar(target, labels, 3.0, generator=torch.Generator().manual_seed(seed), progress="calibrate")
    null = torch.full_like(labels, target.config.null_class)
    return torch.cat([labels, null]), torch.cat([tokens[:, :-1], tokens[:, :-1]]), None


GPT_INT8 = Int8Layout("layers", (("attention_norm", ("attention.wqkv",)),
                                 ("ffn_norm", ("feed_forward.w1", "feed_forward.w3"))),
                      ("feed_forward.w3", "feed_forward.w2"), ("attention.wo",))

ARCH = TargetArch("llamagen", "gpt", GPTConfig, load_gpt, _conditioning, int8=GPT_INT8, calibration=_calibration,
                  model=GPT, inflation="vvs.families.llamagen.inflate")
