"""Checkpoint formats: official LlamaGen / LANTERN files round-trip strictly; bad files fail in one clear line."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from vvs.discrete.drafter import Drafter, DrafterConfig
from vvs.discrete.loading import load_drafter
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.families.llamagen.loading import load_gpt
from vvs.models.layers import causal_mask
from vvs.models.loading import CheckpointError, load_vq, save_model
from vvs.models.vq import VQModel, vq_config


def official_gpt_file(model: GPT, path, prefix: str = "") -> None:
    """LlamaGen's train script layout: weights under "model", training args as an argparse.Namespace."""
    state = {prefix + k: v for k, v in model.state_dict().items()}
    torch.save({"model": state, "steps": 10, "args": argparse.Namespace(gpt_model="GPT-B")}, path)


@torch.no_grad()
def test_official_gpt_b_roundtrip(tmp_path):
    torch.manual_seed(0)
    config = gpt_config("GPT-B")
    model = GPT(config).eval()
    keys = model.state_dict()
    # spot-check the official names and shapes (LlamaGen gpt.py)
    assert keys["cls_embedding.embedding_table.weight"].shape == (1001, 768)
    assert keys["layers.11.attention.wqkv.weight"].shape == (3 * 768, 768)
    assert keys["layers.0.feed_forward.w1.weight"].shape == (2048, 768)
    assert {"tok_embeddings.weight", "norm.weight", "output.weight", "layers.0.attention_norm.weight",
            "layers.0.ffn_norm.weight", "layers.0.attention.wo.weight", "layers.0.feed_forward.w2.weight",
            "layers.0.feed_forward.w3.weight"} <= keys.keys()
    assert len(keys) == 3 + 1 + 12 * 7
    path = tmp_path / "c2i_B_256.pt"
    official_gpt_file(model, path, prefix="module.")
    loaded = load_gpt(path, config)
    pos = torch.arange(1)[None]
    ref = model(condition=torch.tensor([3]), position_ids=pos, mask=causal_mask(1))
    got = loaded(condition=torch.tensor([3]), position_ids=pos, mask=causal_mask(1))
    assert torch.equal(ref.logits, got.logits) and torch.equal(ref.new_kv, got.new_kv)


@torch.no_grad()
def test_official_t2i_keys_and_uncond_buffer(tmp_path):
    torch.manual_seed(0)
    config = gpt_config("GPT-tiny", model_type="t2i", cls_token_num=5, caption_dim=24)
    model = GPT(config).eval()
    keys = model.state_dict()
    assert {"cls_embedding.cap_proj.fc1.weight", "cls_embedding.cap_proj.fc2.weight",
            "cls_embedding.uncond_embedding"} <= keys.keys()
    assert "cls_embedding.uncond_embedding" not in dict(model.named_parameters())
    path = tmp_path / "t2i.pt"
    official_gpt_file(model, path)
    loaded = load_gpt(path, config)
    assert torch.equal(loaded.cls_embedding.uncond_embedding, model.cls_embedding.uncond_embedding)


@torch.no_grad()
def test_official_vq16_roundtrip(tmp_path):
    torch.manual_seed(0)
    config = vq_config("VQ-16")
    model = VQModel(config).eval()
    keys = model.state_dict()
    assert keys["quantize.embedding.weight"].shape == (16384, 8)
    assert keys["quantize.codebook_used"].shape == (65536,)
    assert "encoder.conv_blocks.4.attn.1.proj_out.weight" in keys
    assert "decoder.conv_blocks.0.attn.2.q.weight" in keys
    assert "decoder.conv_blocks.3.upsample.conv.weight" in keys
    assert "encoder.conv_blocks.0.downsample.conv.weight" in keys
    path = tmp_path / "vq_ds16_c2i.pt"
    torch.save({"model": model.state_dict()}, path)
    loaded = load_vq(path, config)
    codes = torch.randint(0, 16384, (1, 4))
    assert torch.equal(model.decode_codes(codes, 2), loaded.decode_codes(codes, 2))
    img = model.decode_codes(codes, 2)
    assert img.shape == (1, 3, 32, 32) and img.min() >= 0 and img.max() <= 1


@pytest.mark.parametrize("weights_name", ["pytorch_model.bin", "model.safetensors"])
@torch.no_grad()
def test_lantern_drafter_folder_roundtrip(tmp_path, weights_name):
    torch.manual_seed(0)
    target = gpt_config("GPT-B")
    cfg = DrafterConfig.for_target(target)
    drafter = Drafter(cfg, target).eval()
    keys = drafter.state_dict()
    assert {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
            "layers.0.mlp.gate_proj.weight", "layers.0.post_attention_layernorm.weight"} <= keys.keys()
    assert not any("input_layernorm" in k for k in keys) and "norm.weight" not in keys
    folder = tmp_path / "llamagen_drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**cfg.to_hf_json(), "input_type": "c2i", "pad_token_id": None}))
    if weights_name.endswith(".bin"):
        torch.save(drafter.state_dict(), folder / weights_name)
    else:
        save_file(drafter.state_dict(), folder / weights_name)
    loaded = load_drafter(folder, target)
    feats, ids = torch.randn(2, 3, 768), torch.randint(0, 16384, (2, 3))
    pos = torch.arange(1, 4).expand(2, -1)
    assert torch.equal(drafter(feats, ids, pos, causal_mask(3)).hidden, loaded(feats, ids, pos, causal_mask(3)).hidden)


def test_vvs_safetensors_roundtrip_carries_config(tmp_path):
    torch.manual_seed(0)
    model = GPT(gpt_config("GPT-tiny")).eval()
    path = save_model(model, tmp_path / "t.safetensors", "gpt")
    loaded = load_gpt(path)
    assert loaded.config == model.config
    assert not list(tmp_path.glob("*.tmp"))


# --------------------------------------------------------------------------- bad files


@pytest.fixture
def tiny_official(tmp_path):
    torch.manual_seed(0)
    model = GPT(gpt_config("GPT-tiny"))
    path = tmp_path / "tiny.pt"
    official_gpt_file(model, path)
    return model, path


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_keys(tiny_official, tmp_path):
    model, _ = tiny_official
    state = model.state_dict()
    del state["layers.1.attention.wqkv.weight"]
    path = tmp_path / "missing.pt"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, model.config)
    msg = one_line(err)
    assert str(path) in msg and "missing 1 key(s) (layers.1.attention.wqkv.weight)" in msg
    assert "--config" not in msg  # the sizes agree: no hint to pick another config


def test_wrong_shapes_name_the_size_mismatch(tiny_official):
    _, path = tiny_official
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-tiny", dim=96, n_head=4))
    msg = one_line(err)
    assert "wrong shape" in msg and "dim 64" in msg and "pick the matching --config" in msg


def test_config_mismatch_of_a_different_size(tiny_official):
    _, path = tiny_official
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-B"))
    assert "c2i model with dim 64, 2 layers, vocab 256" in one_line(err)


@torch.no_grad()
def test_official_file_with_freqs_cis_loads(tmp_path):
    """Some official files carry the RoPE table ``freqs_cis``; LlamaGen's own loaders ignore it."""
    torch.manual_seed(0)
    model = GPT(gpt_config("GPT-tiny")).eval()
    path = tmp_path / "with_rope.pt"
    torch.save({"model": {**model.state_dict(), "freqs_cis": torch.randn(17, 4, 2)}}, path)
    loaded = load_gpt(path, model.config)
    pos = torch.arange(1)[None]
    assert torch.equal(loaded(condition=torch.tensor([3]), position_ids=pos, mask=causal_mask(1)).logits,
                       model(condition=torch.tensor([3]), position_ids=pos, mask=causal_mask(1)).logits)


def test_drafter_trained_for_another_kind_of_target_is_refused(tmp_path):
    target = gpt_config("GPT-tiny")
    cfg = DrafterConfig.for_target(target)
    folder = tmp_path / "t2i_drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**cfg.to_hf_json(), "input_type": "t2i"}))
    save_file(Drafter(cfg, target).state_dict(), folder / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_drafter(folder, target)
    assert "trained for a t2i target (input_type) but the target is c2i" in one_line(err)


def test_vvs_file_config_mismatch(tmp_path):
    path = save_model(GPT(gpt_config("GPT-tiny")), tmp_path / "t.safetensors", "gpt")
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-tiny", n_layer=3))
    assert "n_layer: file 2 vs requested 3" in one_line(err)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_truncated_file(tmp_path, suffix):
    model = GPT(gpt_config("GPT-tiny"))
    path = tmp_path / f"cut{suffix}"
    if suffix == ".pt":
        official_gpt_file(model, path)
    else:
        save_model(model, path, "gpt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, model.config if suffix == ".pt" else None)
    assert "truncated or corrupt" in one_line(err)


@pytest.mark.parametrize("name,content,kind", [
    ("README.md", "# vvs\n\nA toolkit.\n".encode(), "text"), ("config.toml", b"[model]\ndim = 64\n", "text"),
    ("cat.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "a PNG image"), ("blob.bin", bytes([7, 0, 1, 2] * 8), "some other file"),
])
def test_a_file_that_is_not_a_checkpoint_is_told_so(tmp_path, name, content, kind):
    """Not "contains pickled Python objects ... re-save it as safetensors", which sends a user the wrong way."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-tiny"))
    assert one_line(err) == (f"{path}: not a checkpoint ({kind}): give a .pt / .pth / .bin file written by "
                             "torch.save, or a .safetensors file")
    path.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-tiny"))
    assert one_line(err) == f"{path}: an empty file, not a checkpoint"


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": Exploit(marker)}, path)
    with pytest.raises(CheckpointError) as err:
        load_gpt(path, gpt_config("GPT-tiny"))
    assert "refused" in one_line(err)
    assert not marker.exists()


def test_cli_reports_bad_checkpoint_in_one_line_with_exit_2(tmp_path):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint at all")
    proc = subprocess.run(
        [sys.executable, "-c", "from vvs.cli.export import main; main()",
         "--checkpoint", str(path), "--config", "GPT-tiny", "--out", str(tmp_path / "engines")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("vvs-export: error: ") and str(path) in lines[0]
