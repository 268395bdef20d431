"""Janus-Pro's target architecture for the discrete-token machinery (:class:`vvs.discrete.arch.TargetArch`)."""
from __future__ import annotations

from pathlib import Path

from vvs.calib.int8 import LLAMA_INT8
from vvs.discrete.arch import TargetArch, prompt_calibration
from vvs.errors import VVSError
from vvs.families.janus_pro.loading import load_janus
from vvs.families.janus_pro.model import JanusConfig, JanusGen
from vvs.families.janus_pro.prompts import PromptIds, null
from vvs.text.prompts import PromptConditioning


def _conditioning(config: JanusConfig, tables: dict, model_info: dict, tokenizer: Path | None):
    if tokenizer is None:
        raise VVSError("a Janus-Pro target reads prompt ids: give its tokenizer.json (the official folder's)")
    return PromptConditioning(PromptIds.from_file(tokenizer, config), null)


ARCH = TargetArch("janus-pro", "janus", JanusConfig, load_janus, _conditioning, int8=LLAMA_INT8,
                  calibration=prompt_calibration(cfg_scale=5.0), model=JanusGen, inflation="vvs.families.janus_pro.inflate")
