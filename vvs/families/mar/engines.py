"""MAR engine sets: the seven graphs of :mod:`vvs.families.mar.graphs` behind the same :class:`Engine` interface as
the LlamaGen graphs, on the torch backend (eager modules), or ONNX Runtime or OpenVINO (an engine folder)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from vvs.engines.base import Engine
from vvs.errors import VVSError
from vvs.families.mar.graphs import build_mar_graphs, mar_graph_specs, sampling_steps
from vvs.families.mar.model import MAR, MARConfig
from vvs.families.mar.options import MAROptions

MAR_GRAPHS = ("target_forward", "target_head", "target_head_steps", "draft_forward", "draft_head", "draft_head_steps",
              "latent_decode")
TORCH_WEIGHTS = {"target": "torch_target.safetensors", "draft": "torch_draft.safetensors",
                 "tokenizer": "torch_tokenizer.safetensors"}


@dataclass
class MAREngineSet:
    backend: str
    target: MARConfig
    draft: MARConfig
    graphs: dict[str, Engine]
    device: torch.device
    image_size: int
    default_options: dict = field(default_factory=dict)

    @property
    def sampling_steps(self) -> int:
        return sampling_steps(self.target)

    def check_options(self, opts: MAROptions) -> None:
        opts.check_model(self.target.seq_len)

    def close(self) -> None:
        pass


def check_folder_options(manifest: dict, backend: str, opts: MAROptions) -> None:
    """What :meth:`MAREngineSet.check_options` checks, from the folder's manifest alone (before anything is loaded)."""
    opts.check_model(MARConfig(**manifest["model"]["target"]).seq_len)


def check_pair(target: MARConfig, draft: MARConfig) -> None:
    """Draft and target share each token's noise, so they must agree on what a token and its sampler are."""
    for name in ("seq_len", "token_embed_dim", "class_num", "num_sampling_steps", "patch_size"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            raise VVSError(f"the draft MAR does not fit the target: {name} is {b} for the draft but {a} for the "
                           "target (CSpD shares each token's diffusion noise between them)")


def torch_mar_engines(target: MAR, draft: MAR, tokenizer: nn.Module, image_size: int,
                      device: str | torch.device = "cpu", default_options: dict | None = None) -> MAREngineSet:
    from vvs.engines.torch_backend import TorchEngine

    check_pair(target.config, draft.config)
    device = torch.device(device)
    modules = build_mar_graphs(target, draft, tokenizer)
    for module in modules.values():
        module.to(device).float()
    specs = mar_graph_specs(target.config, draft.config, image_size)
    return MAREngineSet("torch", target.config, draft.config,
                        {name: TorchEngine(modules[name], specs[name]) for name in MAR_GRAPHS}, device, image_size,
                        dict(default_options or {}))


def tokenizer_from_manifest(folder: Path, record: dict) -> nn.Module:
    from vvs.families.mar.latents import KLLatents, VQLatents
    from vvs.families.mar.loading import load_kl_vae
    from vvs.models.loading import load_vq

    path = Path(folder) / TORCH_WEIGHTS["tokenizer"]
    if record["kind"] == "vq-latents":
        return VQLatents(load_vq(path).float(), record["scale"])
    return KLLatents(load_kl_vae(path).float())


def load_mar_folder(folder: str | Path, manifest: dict | None = None, backend: str = "onnxruntime",
                    device: str | None = None, threads: int | None = None, cuda_graphs: bool = False) -> MAREngineSet:
    """A MAR engine folder on ONNX Runtime (also for ``auto``), OpenVINO or the torch backend. ``cuda_graphs`` is
    not used: MAR's step shapes change every step."""
    from vvs.engines.manifest import read_manifest, verify_files
    from vvs.engines.onnxruntime_backend import open_graphs
    from vvs.families.mar.loading import load_mar

    folder = Path(folder)
    manifest = manifest or read_manifest(folder)
    model = manifest["model"]
    if backend == "torch":
        verify_files(folder, manifest, list(TORCH_WEIGHTS.values()))
        if threads:
            torch.set_num_threads(threads)
        return torch_mar_engines(load_mar(folder / TORCH_WEIGHTS["target"]), load_mar(folder / TORCH_WEIGHTS["draft"]),
                                 tokenizer_from_manifest(folder, model["tokenizer"]), model["image_size"],
                                 device or "cpu", manifest["decoding_defaults"])
    if backend == "openvino":
        from vvs.engines.openvino_backend import check_device, open_graphs as open_openvino

        dev = check_device(device)
        graphs = open_openvino(folder, manifest, MAR_GRAPHS, threads)
    else:
        dev = torch.device(device or "cpu")
        backend, graphs = "onnxruntime", open_graphs(folder, manifest, MAR_GRAPHS, dev, threads)
    return MAREngineSet(backend, MARConfig(**model["target"]), MARConfig(**model["draft"]), graphs, dev,
                        model["image_size"], manifest["decoding_defaults"])


def quality_instruments(folder: Path, manifest: dict, classifier):
    """The photo classifier (MAR's continuous tokens have no NLL column)."""
    from vvs.quality import Instruments

    return Instruments(classifier)
