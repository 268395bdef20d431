"""A T5-family encoder into an engine folder: the ``text_encode`` graph, the tokenizer, and the encoder's own
``transformers`` files (the torch backend's reference, and what a later rebuild starts from).

``transformers`` is the encoder's reference implementation (it builds FLAN-T5-XL, or any T5-family encoder, from
a local folder or, where the hub is reachable, a name); the graph is its last hidden state, float32 (T5 is known to
overflow in float16).
"""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.errors import VVSError
from vvs.export.onnx_export import export_graph
from vvs.export.spec import text_encode_spec

TEXT_DIR = "text"  # in the engine folder: tokenizer.json, config.json, model.safetensors
TOKENIZER = f"{TEXT_DIR}/tokenizer.json"


class EncoderGraph(torch.nn.Module):
    """T5 encoder: token ids and attention mask -> last hidden state."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def load_text_encoder(source: str | Path, caption_dim: int):
    """The ``transformers`` T5 encoder and fast tokenizer of ``source`` (a folder or a model name), checked
    against the target's caption width before anything is exported."""
    from transformers import AutoConfig, AutoTokenizer, T5EncoderModel

    try:
        config = AutoConfig.from_pretrained(str(source))
    except (OSError, ValueError) as err:
        raise VVSError(f"option --text-encoder {source}: transformers cannot load it ({str(err).splitlines()[0]}); "
                       "give a folder with a T5-family config.json, weights and tokenizer") from None
    if config.model_type not in ("t5", "mt5", "umt5"):
        raise VVSError(f"option --text-encoder {source}: a {config.model_type} model; a T5-family encoder is needed")
    if config.d_model != caption_dim:
        raise VVSError(f"option --text-encoder {source}: its states are {config.d_model} wide but the target takes "
                       f"{caption_dim}-wide captions; use the encoder the target was trained with")
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if not tokenizer.is_fast:
        raise VVSError(f"option --text-encoder {source}: no fast tokenizer (tokenizer.json, or spiece.model with "
                       "sentencepiece installed)")
    encoder = T5EncoderModel.from_pretrained(str(source), dtype=torch.float32).eval()
    return encoder, tokenizer


def export_text_encoder(encoder, tokenizer, work: Path, slots: int) -> tuple[dict, list[Path]]:
    """Write ``text_encode.onnx`` and ``text/`` into ``work``; returns the manifest's graph entry and the files."""
    spec = text_encode_spec(slots, encoder.config.d_model)
    files = export_graph(EncoderGraph(encoder), spec, work / "text_encode.onnx", encoder.config.vocab_size, 0)
    encoder.save_pretrained(work / TEXT_DIR, safe_serialization=True)
    tokenizer.backend_tokenizer.save(str(work / TOKENIZER))
    files += sorted(p for p in (work / TEXT_DIR).iterdir() if p.is_file())
    return {"file": files[0].name, "spec": spec.to_dict()}, files
