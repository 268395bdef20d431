"""Stand-ins for Janus-Pro tests: a tiny random ``transformers`` Janus model (the reference implementation) and the
same weights written as an official deepseek-ai folder (config.json, safetensors shards with their index,
tokenizer.json), which is what vvs loads. The official weights cannot be fetched here; the folder has their
format, key names and VQ-16 tokenizer architecture, with random values and a small language model."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers import AddedToken

from vvs.families.janus_pro.loading import SPECIAL_TOKENS
from vvs.models.vq import VQModel, vq_config

TEXT_VOCAB, DIM, LAYERS, HEADS, FFN, CODES, GRID = 300, 64, 2, 4, 96, 16384, 4
BOS, PAD, BOI = 1, 2, 3
WORDS = ["a", "red", "blue", "green", "cat", "dog", "house", "on", "the", "hill", "photo", "of", "small", "big",
         "tree", "river", "at", "night", "sunny", "day"]


def hf_janus(seed: int = 0):
    """A random ``JanusForConditionalGeneration`` of the tiny sizes above, whose image path draws GRID² codes."""
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig
    from transformers.models.janus.configuration_janus import JanusVisionConfig, JanusVQVAEConfig

    text = LlamaConfig(hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       vocab_size=TEXT_VOCAB, rms_norm_eps=1e-6, max_position_embeddings=256, bos_token_id=BOS,
                       pad_token_id=PAD, eos_token_id=5)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=CODES, projection_dim=DIM, image_token_embed_dim=DIM,
                          base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, latent_channels=32,
                          resolution=64)
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               image_size=64, patch_size=64 // GRID, projection_dim=DIM, num_image_tokens=GRID * GRID)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                                                      image_token_id=4)).eval()
    with torch.no_grad():  # transformers zero-initialises biases; random ones test that they are loaded and used
        for name, p in model.named_parameters():
            if name.endswith(".bias") and "generation_" in name:
                p.normal_(0, 0.05)
    model.generation_config.generation_kwargs = {"boi_token_id": BOI}
    return model


def official_state(model) -> dict[str, torch.Tensor]:
    """The transformers weights under deepseek-ai's names (the inverse of transformers' conversion script), minus
    its VQ model, which :func:`write_official_folder` replaces by a VQ-16 in LlamaGen's naming."""
    renames = [("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
               ("model.generation_embeddings.", "gen_embed."), ("model.generation_aligner.fc1.", "gen_aligner.layers.0."),
               ("model.generation_aligner.hidden_layers.0.", "gen_aligner.layers.2."),
               ("model.generation_head.proj_out.", "gen_head.output_mlp_projector."),
               ("model.generation_head.vision_head.", "gen_head.vision_head."),
               ("model.vision_model.", "vision_model."), ("model.aligner.", "aligner.")]
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("model.vqmodel."):
            continue
        new = next((new + key[len(old):] for old, new in renames if key.startswith(old)), None)
        assert new is not None, key
        state[new] = value.detach().clone().contiguous()
    return state


def tokenizer() -> Tokenizer:
    vocab = {"<unk>": 0, **{name: i for i, name in zip((BOS, PAD, BOI), SPECIAL_TOKENS.values())},
             "<|User|>": 4, "<|Assistant|>": 5, ":": 6, **{w: 7 + i for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*SPECIAL_TOKENS.values(), "<|User|>",
                                                                  "<|Assistant|>")])
    return tok


def official_config() -> dict:
    """config.json as the deepseek-ai folders write it (their language_config sets a few keys only)."""
    return {
        "model_type": "multi_modality",
        "language_config": {"hidden_size": DIM, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
                            "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "vocab_size": TEXT_VOCAB,
                            "max_position_embeddings": 256, "torch_dtype": "bfloat16"},
        "gen_head_config": {"cls": "vision_head", "model_type": "gen_head",
                            "params": {"image_token_embed": DIM, "image_token_size": CODES, "n_embed": DIM}},
        "gen_aligner_config": {"cls": "MlpProjector", "model_type": "gen_aligner",
                               "params": {"depth": 2, "input_dim": 8, "n_embed": DIM, "projector_type": "mlp_gelu"}},
        "gen_vision_config": {"cls": "VQ-16", "model_type": "gen_vision",
                              "params": {"image_token_size": CODES, "n_embed": 8}},
        "vision_config": {"cls": "CLIPVisionTower", "model_type": "vision", "params": {}},
        "aligner_config": {"cls": "MlpProjector", "model_type": "aligner", "params": {}},
    }


def write_official_folder(model, folder: Path, shards: int = 2, vq_seed: int = 0) -> Path:
    """``model``'s weights (plus a random VQ-16) as an official folder, in ``shards`` safetensors files + index."""
    folder.mkdir(parents=True, exist_ok=True)
    state = official_state(model)
    torch.manual_seed(vq_seed)
    state.update({f"gen_vision_model.{k}": v for k, v in VQModel(vq_config("VQ-16")).state_dict().items()})
    keys = sorted(state)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[s::shards]}
        save_file(part, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(official_config()))
    tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def small_janus_bundle(tmp: Path, seed: int = 0):
    """A tiny random Janus-architecture target (256 codes, a 4 x 4 grid, 12 prompt slots; its head sharpened so
    that sampling has structure), a tiny VQ, the stand-in tokenizer, and a drafter briefly trained on the target's
    own samples for the prompts of :data:`WORDS`, so that drafts get accepted."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.train_drafter import train_drafter
    from vvs.families.janus_pro.model import JanusGen, janus_config
    from vvs.families.janus_pro.prompts import PromptIds
    from vvs.models.layers import caption_causal_mask

    torch.manual_seed(seed)
    target = JanusGen(janus_config("Janus-tiny")).eval()
    with torch.no_grad():
        target.gen_head.vision_head.weight.mul_(40)
    vq = VQModel(vq_config("VQ-tiny", codebook_size=target.config.vocab_size)).eval()
    path = tmp / "tokenizer.json"
    tokenizer().save(str(path))
    gen = torch.Generator().manual_seed(seed)
    prompts = [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (int(k),), generator=gen).tolist())
               for k in torch.randint(1, 7, (48,), generator=gen)]
    ids, mask = PromptIds.from_file(path, target.config).encode(prompts)
    tokens = torch.zeros(len(ids), 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(target.config.num_image_tokens):
            causal = caption_causal_mask(mask, ids.shape[1] + tokens.shape[1])
            logits = target.teacher_forced(ids, tokens, causal).logits[:, -1]
            tokens = torch.cat([tokens, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
    drafter = train_drafter(target, ids, tokens, tmp, seed, steps=300, batch=16, lr=3e-3, caption_mask=mask)
    return ModelBundle(target, drafter, vq, "janus-pro", path)
