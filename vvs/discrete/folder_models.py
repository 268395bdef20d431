"""An engine folder's target and drafter as torch modules: from their torch weights where the folder was exported
with them (``--torch-weights``), else read back from the weights its graphs multiply by, so that a folder holds
them once. The torch backend, ``export_tree`` (other draft-tree shapes), ``vvs-bench --scale`` and the quality
instruments read them here."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.discrete.drafter import Drafter, DrafterConfig
from vvs.discrete.loading import load_drafter
from vvs.engines.manifest import TORCH_WEIGHTS, EngineFolderError, graph_weights
from vvs.families.registry import family_of


def folder_target(folder: Path, manifest: dict) -> torch.nn.Module:
    """The folder's target as a torch module (float32): its torch weights where it was exported with them
    (``--torch-weights``), else the weights its target graphs multiply by, so that a folder holds them once."""
    arch = family_of(manifest).entry("target_arch")
    if TORCH_WEIGHTS["target"] in manifest["files"]:
        return arch.load(Path(folder) / TORCH_WEIGHTS["target"])
    from vvs.models.inflation import empty_model

    model = empty_model(arch.model, arch.config(**manifest["model"]["target"]))
    _read_graphs(model, folder, manifest, ("target_prefill", "target_verify"), "target.", "target")
    return model.eval()


def folder_drafter(folder: Path, manifest: dict, target) -> Drafter | None:
    """The folder's drafter for ``target``'s config, from its torch weights or its draft_tree graph; None without
    one."""
    if "drafter" not in manifest["model"]:
        return None
    if TORCH_WEIGHTS["drafter"] in manifest["files"]:
        return load_drafter(Path(folder) / TORCH_WEIGHTS["drafter"], target)
    model = Drafter(DrafterConfig(**manifest["model"]["drafter"]), target)
    _read_graphs(model, folder, manifest, ("draft_tree",), "step.drafter.", "drafter")
    return model.eval()


def _read_graphs(model: torch.nn.Module, folder: Path, manifest: dict, graphs: tuple, prefix: str, what: str) -> None:
    from vvs.export.shared_weights import graph_parameters

    params = dict(model.named_parameters())
    found = graph_parameters(folder, [manifest["graphs"][g]["file"] for g in graphs], prefix,
                             {name: tuple(p.shape) for name, p in params.items()})
    missing = sorted(set(params) - set(found))
    if missing:
        raise EngineFolderError(f"{folder}: the {what}'s {missing[0]} cannot be read back from its "
                                f"{graph_weights(manifest, graphs[0])} graphs for torch; export the folder with "
                                "--torch-weights")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(found[name])
