"""Lumina-mGPT's target architecture for the discrete-token machinery (:class:`vvs.discrete.arch.TargetArch`):
Chameleon's decoder over prompt ids, its image stream with end-of-line tokens forced at row ends, Chameleon's
VQGAN as the image tokenizer."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from vvs.calib.int8 import LLAMA_INT8
from vvs.discrete.arch import TargetArch, prompt_calibration
from vvs.errors import VVSError
from vvs.families.lumina_mgpt.loading import load_lumina, load_vqgan
from vvs.families.lumina_mgpt.model import ChameleonConfig, ChameleonGen
from vvs.families.lumina_mgpt.prompts import PromptIds, null
from vvs.runtime.conditions import TokenLayout
from vvs.text.prompts import PromptConditioning


def _conditioning(config: ChameleonConfig, tables: dict, model_info: dict, tokenizer: Path | None):
    if tokenizer is None:
        raise VVSError("a Lumina-mGPT target reads prompt ids: give its text tokenizer (the official folder's "
                       "tokenizer.json, or Chameleon's text_tokenizer.json)")
    return PromptConditioning(PromptIds.from_file(tokenizer, config), null)


def _token_layout(config: ChameleonConfig) -> TokenLayout:
    return TokenLayout(config.forced_stream())


# Chameleon's blocks are Llama's with query/key norms after the projections, which smoothing the projections'
# inputs leaves alone
CHAMELEON_INT8 = dataclasses.replace(LLAMA_INT8, blocks="model.layers")

ARCH = TargetArch("lumina-mgpt", "chameleon", ChameleonConfig, load_lumina, _conditioning, int8=CHAMELEON_INT8,
                  calibration=prompt_calibration(cfg_scale=3.0), model=ChameleonGen, token_layout=_token_layout,
                  vq_kind="chameleon-vqgan", load_vq=load_vqgan, inflation="vvs.families.lumina_mgpt.inflate")
