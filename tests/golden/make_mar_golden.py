"""Write ``mar_official.safetensors``: small randomly initialised MAR and KL-VAE models built with the *official*
code (LTH14/mar), their state dicts, inputs, and the official code's outputs. ``tests/test_mar_models.py`` loads
the state dicts into vvs's models and must reproduce the outputs.

Run from a checkout of https://github.com/LTH14/mar (commit recorded in the file's metadata):
    python tests/golden/make_mar_golden.py /path/to/mar
It needs timm (MAR's blocks are timm's ``Block``); timm imports torchvision at import time, which this script
stubs out when it is missing (the ViT block itself does not use it).
"""
import importlib.abc
import importlib.machinery
import subprocess
import sys
import types
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file


def stub_torchvision():
    try:
        import torchvision  # noqa: F401
        return
    except Exception:
        pass

    class Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return name

    class Dummy(metaclass=Meta):
        def __init__(self, *a, **k):
            pass

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Dummy

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            return Stub(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, Finder())


MAR_KW = dict(img_size=64, vae_stride=16, patch_size=1, encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=4,
              decoder_embed_dim=64, decoder_depth=2, decoder_num_heads=4, vae_embed_dim=16, class_num=10,
              buffer_size=8, diffloss_d=2, diffloss_w=96, num_sampling_steps="20")
VAE_KW = dict(embed_dim=4, ch=32, ch_mult=(1, 1), resolution=32)


def main(source: Path) -> None:
    stub_torchvision()
    sys.path.insert(0, str(source))
    torch.Tensor.cuda = lambda self, *a, **k: self  # the official sampler moves timesteps to CUDA
    from models import vae as official_vae
    from models.mar import MAR

    torch.manual_seed(0)
    mar = MAR(mlp_ratio=4, norm_layer=partial(nn.LayerNorm, eps=1e-6), **MAR_KW).eval()
    for p in mar.parameters():  # the official init zeroes the head's output layers; make every weight matter
        p.data.normal_(0, 0.1)
    out = {f"mar.{k}": v.contiguous() for k, v in mar.state_dict().items()}

    b, n = 3, mar.seq_len
    tokens = torch.randn(b, n, 16)
    orders = torch.stack([torch.randperm(n) for _ in range(b)])
    mask = torch.zeros(b, n).scatter_(1, orders[:, :10], 1.0)  # MAR drops tokens: the same count per row
    labels = torch.tensor([1, 4, 9])
    net = mar.diffloss.net
    gen = mar.diffloss.gen_diffusion
    with torch.no_grad():
        z = mar.forward_mae_decoder(mar.forward_mae_encoder(tokens, mask, mar.class_emb(labels)), mask)
        z_null = mar.forward_mae_decoder(mar.forward_mae_encoder(tokens, mask, mar.fake_latent.repeat(b, 1)), mask)
        cond, uncond, x = torch.randn(5, 64), torch.randn(5, 64), torch.randn(5, 16)
        for i in (19, 7, 0):
            pmv = gen.p_mean_variance(net.forward, x, torch.full((5,), i), clip_denoised=False,
                                      model_kwargs=dict(c=cond))
            out[f"step{i}.mean"], out[f"step{i}.log_var"] = pmv["mean"], pmv["log_variance"]
        pmv = gen.p_mean_variance(net.forward_with_cfg, torch.cat([x, x]), torch.full((10,), 5), clip_denoised=False,
                                  model_kwargs=dict(c=torch.cat([cond, uncond]), cfg_scale=2.5))
        out["cfg_step5.mean"], out["cfg_step5.log_var"] = pmv["mean"][:5], pmv["log_variance"][:5]
        torch.manual_seed(5)
        noise = torch.randn(5, 16)
        out["loop.sample"] = gen.p_sample_loop(net.forward, noise.shape, noise, clip_denoised=False,
                                               model_kwargs=dict(c=cond), temperature=0.9)
        torch.manual_seed(5)
        torch.randn(5, 16)  # the official loop draws one normal tensor per step, the last one masked to zero
        out["loop.step_noise"] = torch.stack([torch.randn(5, 16) for _ in range(gen.num_timesteps)], 1)
        out["loop.noise"] = noise

    official_vae.Encoder = partial(official_vae.Encoder, ch=VAE_KW["ch"], resolution=VAE_KW["resolution"])
    official_vae.Decoder = partial(official_vae.Decoder, ch=VAE_KW["ch"], resolution=VAE_KW["resolution"])
    vae = official_vae.AutoencoderKL(embed_dim=VAE_KW["embed_dim"], ch_mult=VAE_KW["ch_mult"]).eval()
    out.update({f"vae.{k}": v.contiguous() for k, v in vae.state_dict().items()})
    images, latents = torch.randn(2, 3, 32, 32), torch.randn(2, 4, 16, 16)
    with torch.no_grad():
        out["vae_io.images"], out["vae_io.mean"] = images, vae.encode(images).mean
        out["vae_io.latents"], out["vae_io.decoded"] = latents, vae.decode(latents)

    out.update({"in.tokens": tokens, "in.mask": mask, "in.labels": labels, "out.z": z, "out.z_null": z_null,
                "in.cond": cond, "in.uncond": uncond, "in.x": x})
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    save_file({k: v.contiguous() for k, v in out.items()}, Path(__file__).with_name("mar_official.safetensors"),
              metadata={"source": "https://github.com/LTH14/mar", "commit": commit.strip() or "unknown"})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
