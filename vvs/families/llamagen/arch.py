"""LlamaGen's target architecture for the discrete-token machinery (:class:`vvs.discrete.arch.TargetArch`)."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.calib.int8 import Int8Layout
from vvs.discrete.arch import TargetArch
from vvs.families.llamagen.conditions import conditioning
from vvs.families.llamagen.gpt import GPT, GPTConfig, sample_ar
from vvs.families.llamagen.loading import load_gpt


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
