"""Chameleon's VQGAN (Lumina-mGPT's image tokenizer): the encoder and quantiser against transformers'
``ChameleonVQVAE``; the decoder, which transformers does not have, against a second implementation written here
from the architecture's description (taming-transformers' decoder: ``conv_in``, a middle block with attention,
levels from the deepest up with one more residual block than the encoder and nearest-neighbour upsampling,
``norm_out``, swish, ``conv_out``); and the strict loader of the official ``vqgan.yaml`` + ``vqgan.ckpt``, on
random weights saved in that format."""
import math

import pytest
import torch
import torch.nn.functional as F

from vvs.families.lumina_mgpt.loading import load_official_vqgan
from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN, VQGANConfig
from vvs.models.loading import CheckpointError

SIZES = dict(embed_dim=16, n_embed=64, z_channels=32, resolution=32, ch=32, ch_mult=(1, 2), num_res_blocks=1)


def random_vqgan(attn_resolutions=()) -> ChameleonVQGAN:
    torch.manual_seed(0)
    model = ChameleonVQGAN(VQGANConfig(**SIZES, attn_resolutions=attn_resolutions)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # GroupNorm gains and biases away from 1 and 0, so that they matter
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
            elif p.dim() > 1:
                p.normal_(0, 0.5 / math.sqrt(p[0].numel()))
    return model


@pytest.mark.parametrize("attn_resolutions", [(), (16,)])
def test_encoder_and_codes_match_transformers(attn_resolutions):
    from transformers.models.chameleon.configuration_chameleon import ChameleonVQVAEConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    ours = random_vqgan(attn_resolutions)
    theirs = ChameleonVQVAE(ChameleonVQVAEConfig(
        embed_dim=SIZES["embed_dim"], num_embeddings=SIZES["n_embed"], latent_channels=SIZES["z_channels"],
        resolution=SIZES["resolution"], base_channels=SIZES["ch"], channel_multiplier=list(SIZES["ch_mult"]),
        num_res_blocks=SIZES["num_res_blocks"], attn_resolutions=list(attn_resolutions))).eval()
    state = {k: v for k, v in ours.state_dict().items()
             if not k.startswith(("decoder.", "post_quant_conv.", "quantize.stream_codes"))}
    theirs.load_state_dict({**state, "post_quant_conv.weight": ours.post_quant_conv.weight,
                            "post_quant_conv.bias": ours.post_quant_conv.bias}, strict=True)
    images = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        want_z = theirs.quant_conv(theirs.encoder(images))
        got_z = ours.quant_conv(ours.encoder(images))
        _, _, want_codes = theirs.encode(images)
        got_codes = ours.encode(images)
    assert (got_z - want_z).abs().max() <= 1e-5 * want_z.abs().max()
    assert torch.equal(got_codes.flatten(), want_codes.flatten())
    assert len(got_codes.unique()) > 4  # the codes are not all one


def reference_decode(state: dict, codes: torch.Tensor, side: int, c: VQGANConfig) -> torch.Tensor:
    """The decoder written from its description, as plain functions over the weights."""
    def norm(x, name):
        return F.group_norm(x, 32, state[f"{name}.weight"], state[f"{name}.bias"], eps=1e-6)

    def conv(x, name, padding=1):
        return F.conv2d(x, state[f"{name}.weight"], state[f"{name}.bias"], padding=padding)

    def resnet(x, name):
        h = conv(F.silu(norm(x, f"{name}.norm1")), f"{name}.conv1")
        h = conv(F.silu(norm(h, f"{name}.norm2")), f"{name}.conv2")
        skip = conv(x, f"{name}.nin_shortcut", 0) if f"{name}.nin_shortcut.weight" in state else x
        return skip + h

    def attention(x, name):
        b, ch, hh, ww = x.shape
        n = norm(x, f"{name}.norm")
        q, k, v = (conv(n, f"{name}.{p}", 0).reshape(b, ch, hh * ww) for p in "qkv")
        weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(ch), dim=-1)  # [b, query, key]
        out = torch.einsum("bij,bcj->bci", weights, v).reshape(b, ch, hh, ww)
        return x + conv(out, f"{name}.proj_out", 0)

    z = state["quantize.embedding.weight"][codes].reshape(codes.shape[0], side, side, -1).permute(0, 3, 1, 2)
    h = conv(conv(z, "post_quant_conv", 0), "decoder.conv_in")
    h = resnet(attention(resnet(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    res = side
    for level in reversed(range(len(c.ch_mult))):
        for i in range(c.num_res_blocks + 1):
            h = resnet(h, f"decoder.up.{level}.block.{i}")
            if res in c.attn_resolutions:
                h = attention(h, f"decoder.up.{level}.attn.{i}")
        if level:
            h = conv(F.interpolate(h, scale_factor=2, mode="nearest"), f"decoder.up.{level}.upsample.conv")
            res *= 2
    h = conv(F.silu(norm(h, "decoder.norm_out")), "decoder.conv_out")
    return (h.clamp(-1, 1) + 1) / 2


@pytest.mark.parametrize("attn_resolutions", [(), (16,)])
def test_decoder_matches_an_independent_implementation(attn_resolutions):
    model = random_vqgan(attn_resolutions)
    codes = torch.randint(0, SIZES["n_embed"], (2, 16 * 16))
    with torch.no_grad():
        got = model.decode(codes, 16, 16)
        want = reference_decode(model.state_dict(), codes, 16, model.config)
    assert got.shape == (2, 3, 32, 32)
    assert (got - want).abs().max() <= 1e-5
    assert 0.05 < want.std()  # an image, not a constant clamped to one end


def write_official(folder, model: ChameleonVQGAN, extra: dict | None = None, yaml_edit=None):
    """``vqgan.yaml`` as the official file lays it out, and ``vqgan.ckpt``: a training checkpoint holding the
    weights under ``state_dict``, the loss's own modules included."""
    import yaml

    c = model.config
    config = {"model": {"target": "taming.models.vqgan.VQModel", "params": {
        "embed_dim": c.embed_dim, "n_embed": c.n_embed,
        "ddconfig": {"double_z": False, "z_channels": c.z_channels, "resolution": c.resolution, "in_channels": 3,
                     "out_ch": 3, "ch": c.ch, "ch_mult": list(c.ch_mult), "num_res_blocks": c.num_res_blocks,
                     "attn_resolutions": list(c.attn_resolutions), "dropout": 0.0},
        "lossconfig": {"target": "taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator"},
        "ckpt_path": "/checkpoint/vqgan.ckpt"}}}
    if yaml_edit:
        yaml_edit(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(yaml.safe_dump(config))
    weights = {k: v for k, v in model.state_dict().items() if k != "quantize.stream_codes"}  # vvs's, not Meta's
    state = {**weights, "loss.discriminator.main.0.weight": torch.zeros(4, 3, 4, 4), **(extra or {})}
    torch.save({"state_dict": state, "epoch": 3, "global_step": 1000, "pytorch-lightning_version": "1.4.2"},
               folder / "vqgan.ckpt")


def test_the_official_files_load_strictly(tmp_path):
    model = random_vqgan()
    write_official(tmp_path, model)
    loaded = load_official_vqgan(tmp_path)
    codes = torch.randint(0, SIZES["n_embed"], (1, 16 * 16))
    with torch.no_grad():
        assert torch.equal(loaded.decode(codes, 16, 16), model.decode(codes, 16, 16))


@pytest.mark.parametrize("extra, yaml_edit, message", [
    ({"decoder.up.9.block.0.conv1.weight": torch.zeros(1)}, None, r"1 unexpected key\(s\) \(decoder.up.9"),
    (None, lambda c: c["model"]["params"].update(n_embed=128),
     r"wrong shape, e.g. quantize.embedding.weight: file \[64, 16\] vs model \[128, 16\] — the file's codebook is "
     r"\[64, 16\], vqgan.yaml says \[128, 16\]"),
    (None, lambda c: c["model"]["params"]["ddconfig"].update(double_z=True), "double_z is true"),
    (None, lambda c: c["model"].pop("params"), r"not a VQGAN config \(model.params"),
    (None, lambda c: c["model"]["params"]["ddconfig"].update(ch=24), "must split into the 32 groups"),
])
def test_a_wrong_file_is_refused_in_one_line(tmp_path, extra, yaml_edit, message):
    write_official(tmp_path, random_vqgan(), extra, yaml_edit)
    with pytest.raises(CheckpointError, match=message) as err:
        load_official_vqgan(tmp_path)
    assert "\n" not in str(err.value)


class Callback:
    """Stands for the training objects a checkpoint may pickle (a Lightning callback's state)."""


def test_a_checkpoint_with_pickled_objects_is_refused(tmp_path):
    model = random_vqgan()
    write_official(tmp_path, model)
    torch.save({"state_dict": model.state_dict(), "callbacks": Callback()}, tmp_path / "vqgan.ckpt")
    with pytest.raises(CheckpointError, match="refused: the file contains pickled Python objects"):
        load_official_vqgan(tmp_path)


@torch.no_grad()
def test_a_llamagen_vq_becomes_a_chameleon_vqgan_with_the_same_codes_and_pictures():
    """``vvs-train lumina-mgpt`` renames a LlamaGen VQ (the shipped tokenizer's size, random weights) into Chameleon's
    VQGAN: the same codes for the same images and the same pictures for the same codes. Its codebook rows must be
    at unit length: Chameleon's quantiser takes the nearest code by L2 distance, LlamaGen's by cosine."""
    from vvs.families.lumina_mgpt.train import chameleon_vqgan
    from vvs.models.vq import VQModel, vq_config

    torch.manual_seed(0)
    vq = VQModel(vq_config("VQ-vvs-S")).eval()
    vq.quantize.embedding.weight.normal_()  # rows of different lengths: the two rules disagree unless normalised
    vqgan = chameleon_vqgan(vq)
    images = torch.rand(2, 3, 128, 128) * 2 - 1
    codes = vq.encode(images).indices
    assert torch.equal(vqgan.encode(images), codes)
    assert (vqgan.decode(codes, 16, 16) - vq.decode_codes(codes, 16)).abs().max() < 1e-5
    vqgan.quantize.embedding.weight.copy_(vq.quantize.embedding.weight)  # the raw rows instead
    assert not torch.equal(vqgan.encode(images), codes)
