"""MAR, its diffusion head and the KL-16 VAE against the official code (LTH14/mar), and their strict loaders.

``golden/mar_official.safetensors`` holds small randomly initialised models built with the official code, and
that code's outputs; ``golden/make_mar_golden.py`` regenerates it from a checkout of LTH14/mar."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, safe_open

from vvs.families.mar.kl_vae import AutoencoderKL, KLConfig
from vvs.families.mar.loading import load_kl_vae, load_mar
from vvs.models.loading import CheckpointError, save_model
from vvs.families.mar.model import MAR, MARConfig, mar_config

GOLDEN = Path(__file__).parent / "golden" / "mar_official.safetensors"
MAR_CFG = MARConfig(img_size=64, vae_stride=16, vae_embed_dim=16, encoder_embed_dim=64, encoder_depth=2,
                    encoder_num_heads=4, decoder_embed_dim=64, decoder_depth=2, decoder_num_heads=4, class_num=10,
                    buffer_size=8, diffloss_d=2, diffloss_w=96, num_sampling_steps="20")
VAE_CFG = KLConfig(embed_dim=4, ch=32, ch_mult=(1, 1), resolution=32)


@pytest.fixture(scope="module")
def golden():
    return load_file(GOLDEN)


def part(golden, prefix):
    return {k[len(prefix):]: v for k, v in golden.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def mar(golden):
    model = MAR(MAR_CFG).eval()
    model.load_state_dict(part(golden, "mar."), strict=True)
    return model


def test_golden_file_records_its_source():
    with safe_open(GOLDEN, "pt") as f:
        meta = f.metadata()
    assert meta["source"] == "https://github.com/LTH14/mar" and len(meta["commit"]) == 40


def test_mar_forward_matches_official_encoder_decoder(mar, golden):
    """vvs masks unknown tokens out of attention where MAR drops them: same features, conditional and null class."""
    tokens, mask = golden["in.tokens"], golden["in.mask"].bool()
    with torch.no_grad():
        z = mar(tokens, mask, golden["in.labels"])
        z_null = mar(tokens, mask, torch.full((3,), MAR_CFG.null_label))
    torch.testing.assert_close(z, golden["out.z"], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(z_null, golden["out.z_null"], atol=2e-5, rtol=1e-4)


def test_unknown_tokens_do_not_change_features(mar, golden):
    tokens, mask = golden["in.tokens"], golden["in.mask"].bool()
    noisy = torch.where(mask[..., None], torch.randn_like(tokens) * 100, tokens)
    with torch.no_grad():
        torch.testing.assert_close(mar(noisy, mask, golden["in.labels"]), golden["out.z"], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("step", [19, 7, 0])
def test_diffusion_step_matches_official_p_mean_variance(mar, golden, step):
    """The absolute tolerance scales with the mean's magnitude: at the noisiest step the mean is x0's estimate,
    (x - sqrt(1 - a) eps) / sqrt(a) with a ~ 1e-5, so float32 rounding of eps is amplified a hundredfold. Recomputed in
    float64, step 19's mean (up to 7250) differs from the golden file by 0.017 and from vvs's float32 by 0.002: the
    file's own rounding, which depends on the CPU's summation order (an AMD EPYC and an Intel Xeon differ there)."""
    with torch.no_grad():
        mean, log_var = mar.diffloss.step(golden["in.x"], step, golden["in.cond"])
    want = golden[f"step{step}.mean"]
    torch.testing.assert_close(mean, want, atol=1e-5 * max(1.0, want.abs().max().item()), rtol=1e-5)
    torch.testing.assert_close(log_var, golden[f"step{step}.log_var"], atol=1e-5, rtol=1e-5)


def test_guided_step_matches_official_forward_with_cfg(mar, golden):
    with torch.no_grad():
        mean, log_var = mar.diffloss.step(golden["in.x"], 5, golden["in.cond"], golden["in.uncond"],
                                          torch.full((5,), 2.5))
    torch.testing.assert_close(mean, golden["cfg_step5.mean"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(log_var, golden["cfg_step5.log_var"], atol=1e-5, rtol=1e-5)


def test_sampler_loop_matches_official_with_a_deterministic_last_step(mar, golden):
    """MAR's sampler returns the last step's mean; vvs samples it. With that noise set to zero they agree."""
    steps = golden["loop.step_noise"].clone()
    steps[:, -1] = 0
    with torch.no_grad():
        mean, std, sample, _ = mar.diffloss.sample(golden["loop.noise"], steps, torch.full((5,), 0.9), golden["in.cond"])
    torch.testing.assert_close(sample, golden["loop.sample"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mean, sample)
    assert (std > 0).all()


def test_kl_vae_matches_official(golden):
    vae = AutoencoderKL(VAE_CFG).eval()
    vae.load_state_dict(part(golden, "vae."), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(vae.encode_mean(golden["vae_io.images"]), golden["vae_io.mean"],
                                   atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(vae.decode(golden["vae_io.latents"]), golden["vae_io.decoded"],
                                   atol=1e-5, rtol=1e-4)


def test_official_mar_checkpoint_loads_strictly_and_picks_ema(tmp_path, golden):
    """The released files are ``{'model': ..., 'model_ema': ...}`` pickles (loaded with weights_only=True)."""
    state = part(golden, "mar.")
    ema = {k: v + 1 for k, v in state.items()}
    path = tmp_path / "checkpoint-last.pth"
    torch.save({"model": state, "model_ema": ema, "epoch": 3}, path)
    assert torch.equal(load_mar(path, MAR_CFG).fake_latent, state["fake_latent"])
    assert torch.equal(load_mar(path, MAR_CFG, ema=True).fake_latent, ema["fake_latent"])
    with pytest.raises(CheckpointError, match="carries no config"):
        load_mar(path)
    with pytest.raises(CheckpointError, match="the file's encoder is 64 wide over 16-dim tokens, the config "
                                              "expects 768 over 16"):
        load_mar(path, mar_config("mar_base", img_size=64, class_num=10, buffer_size=8))
    del state["diffusion_pos_embed_learned"]
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError, match="missing 1 key"):
        load_mar(path, MAR_CFG)


def test_official_kl16_file_loads_strictly(tmp_path, golden):
    path = tmp_path / "kl16.ckpt"
    torch.save({"model": part(golden, "vae.")}, path)
    vae = load_kl_vae(path, VAE_CFG)
    assert torch.equal(vae.post_quant_conv.weight, golden["vae.post_quant_conv.weight"])
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_kl_vae(path, KLConfig(embed_dim=4, ch=64, ch_mult=(1, 1), resolution=32))


def test_official_size_table():
    """The published sizes (MAR README): widths, depths and diffusion heads."""
    assert [(c.encoder_embed_dim, c.encoder_depth, c.diffloss_d, c.diffloss_w, c.seq_len, c.buffer_size)
            for c in map(mar_config, ("mar_base", "mar_large", "mar_huge"))] == \
        [(768, 12, 6, 1024, 256, 64), (1024, 16, 8, 1280, 256, 64), (1280, 20, 12, 1536, 256, 64)]


def test_vvs_file_round_trip_keeps_the_config(tmp_path, mar):
    path = save_model(mar, tmp_path / "m.safetensors", "mar")
    again = load_mar(path)
    assert again.config == MAR_CFG
    assert all(torch.equal(a, b) for a, b in zip(mar.state_dict().values(), again.state_dict().values()))
