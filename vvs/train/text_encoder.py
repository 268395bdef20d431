"""A T5 encoder folder for a text-to-image pair: a Unigram tokenizer trained on the pair's captions and a T5
encoder of the official architecture, saved as ``transformers`` saves a downloaded one (config.json,
model.safetensors, tokenizer.json), so ``vvs-export --text-encoder`` takes it like FLAN-T5-XL.
"""
from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids 0, 1, 2


def train_tokenizer(captions: list[str], vocab_size: int):
    """A T5-style fast tokenizer (Unigram pieces, ``</s>`` appended) trained on ``captions``."""
    from tokenizers import SentencePieceUnigramTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(captions, vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="<unk>")
    unigram.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=unigram, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_input_names=["input_ids", "attention_mask"])


def t5_encoder(vocab_size: int, width: int, layers: int, heads: int, head_dim: int, ff: int, seed: int = 0):
    """A randomly initialised T5 v1.1 / FLAN-T5 encoder (gated GELU feed-forward)."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    config = T5Config(vocab_size=vocab_size, d_model=width, d_kv=head_dim, d_ff=ff, num_layers=layers,
                      num_heads=heads, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)
    return T5EncoderModel(config).eval()


def save_text_encoder(encoder, tokenizer, folder: Path) -> Path:
    encoder.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
