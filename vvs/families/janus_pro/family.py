"""Janus-Pro's registry entry: text to image through its language model's generation path (VQ-16 codes), decoded
by the discrete-token machinery and the shared speculative loop."""
from __future__ import annotations

from vvs.discrete.family import discrete_family

SCALE_SIZES = ("Janus-Pro-1B", "Janus-Pro-7B")  # vvs-bench --scale
M = "vvs.families.janus_pro"

# the official script's sampling: guidance 5, temperature 1, no top-k or top-p (generation_inference.py)
SAMPLING = {"cfg_scale": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

FAMILY = discrete_family(
    name="janus-pro",
    label="Janus-Pro",
    summary="deepseek-ai's Janus-Pro text to image (VQ-16 codes, prompts through its own tokenizer); VVS, EAGLE-2, "
            "LANTERN, speculative Jacobi",
    package=M,
    target_config=(f"{M}.model:JanusConfig", ("num_image_tokens", "head_dim")),
    prompt_ids=True,
    scale_sizes=SCALE_SIZES,
    train_commands=(f"{M}.commands:train_janus_cmd", f"{M}.commands:train_janus_drafter_cmd"),
    sampling=SAMPLING,
    instead={"tune": "tunes draft trees of LlamaGen folders; for Janus-Pro folders compare tree shapes with --sweep"},
)
