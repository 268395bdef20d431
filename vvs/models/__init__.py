"""Torch reference models: LlamaGen GPT, VQ tokenizer, EAGLE-style drafter, and their loaders."""
from vvs.models.drafter import Drafter, DrafterConfig
from vvs.models.gpt import GPT, GPT_SIZES, GPTConfig, causal_mask, gpt_config
from vvs.models.loading import CheckpointError, load_drafter, load_gpt, load_vq, save_model
from vvs.models.vq import VQ_SIZES, VQConfig, VQModel, vq_config

__all__ = [
    "GPT", "GPTConfig", "GPT_SIZES", "gpt_config", "causal_mask",
    "Drafter", "DrafterConfig",
    "VQModel", "VQConfig", "VQ_SIZES", "vq_config",
    "CheckpointError", "load_gpt", "load_vq", "load_drafter", "save_model",
]
