"""``vvs-export --model mar``: a target MAR, a draft MAR and a continuous tokenizer -> an engine folder.

Every family's folder contract (:mod:`vvs.export.folder`): built under a temporary name and renamed into place,
every file in the manifest with its sha256, the torch weights beside the graphs.
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch
from tqdm import tqdm

from vvs.engines.manifest import FORMAT, MANIFEST, file_record, graph_spec
from vvs.families.mar.engines import TORCH_WEIGHTS, check_pair
from vvs.export.folder import folder_transaction, tool_versions
from vvs.families.mar.graphs import build_mar_graphs, mar_graph_specs
from vvs.export.onnx_export import export_graph
from vvs.families.mar.latents import KLLatents
from vvs.models.loading import save_model
from vvs.families.mar.model import MAR, MARConfig
from vvs.families.mar.options import MAROptions


def tokenizer_record(tokenizer: torch.nn.Module) -> tuple[dict, torch.nn.Module, str]:
    """(manifest entry, the module to save, its vvs kind)."""
    if isinstance(tokenizer, KLLatents):
        return {"kind": "kl16", "scale": tokenizer.scale}, tokenizer.vae, "kl_vae"
    return {"kind": "vq-latents", "scale": tokenizer.scale}, tokenizer.vq, "vq"


def export_mar_folder(target: MAR, draft: MAR, tokenizer: torch.nn.Module, out_dir: Path, image_size: int,
                      decoding_defaults: dict | None = None, extra_model_info: dict | None = None,
                      progress: bool = True, force: bool = False) -> dict:
    check_pair(target.config, draft.config)
    defaults = MAROptions().updated(**(decoding_defaults or {}))
    defaults.check_model(target.config.seq_len)
    out_dir = Path(out_dir).resolve()
    with folder_transaction(out_dir, force) as work:
        specs = mar_graph_specs(target.config, draft.config, image_size)
        modules = build_mar_graphs(target.float(), draft.float(), tokenizer.float())
        files, entries = [], {}
        steps = tqdm(list(specs), desc="export", unit="graph", disable=not progress, dynamic_ncols=True)
        for name in steps:
            steps.set_postfix_str(name)
            written = export_graph(modules[name], specs[name], work / f"{name}.onnx", vocab=2, max_position=0)
            onnx.checker.check_model(str(written[0]))
            files += written
            entries[name] = {"file": written[0].name, "spec": specs[name].to_dict()}
        record, tok_module, tok_kind = tokenizer_record(tokenizer)
        files.append(save_model(target, work / TORCH_WEIGHTS["target"], "mar"))
        files.append(save_model(draft, work / TORCH_WEIGHTS["draft"], "mar"))
        files.append(save_model(tok_module, work / TORCH_WEIGHTS["tokenizer"], tok_kind))
        manifest = {
            "format": FORMAT,
            "model": {"family": "mar", "target": target.config.to_dict(), "draft": draft.config.to_dict(),
                      "tokenizer": record, "image_size": image_size, **(extra_model_info or {})},
            "precision": "fp32",
            "graphs": entries,
            "decoding_defaults": defaults.to_dict(),
            "versions": tool_versions(),
            "files": {p.name: file_record(p) for p in files},
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def tensorrt_profiles(manifest: dict, name: str, max_images: int) -> list[dict[str, tuple[tuple, tuple, tuple]]]:
    """One profile per graph. A head call takes the tokens of one step or one verification window: at most every
    token of every image, typically an eighth of them."""
    from vvs.engines.tensorrt_build import profile_of

    seq_len = MARConfig(**manifest["model"]["target"]).seq_len
    return [profile_of(graph_spec(manifest, name), {
        "batch": (1, 2 * max_images, 2 * max_images), "images": (1, max_images, max_images),
        "tokens": (1, max(1, max_images * seq_len // 8), max_images * seq_len)})]


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model mar``: the pair the options name (the shipped pair where they name no file)."""
    from vvs.families.mar.bundle import load_mar_bundle

    o = options
    bundle = load_mar_bundle(o["checkpoint"], o["config"], o["drafter"], o["draft_config"], o["vae"], ema=o["ema"])
    echo(bundle.summary())
    extra = {"classes": bundle.classes} if bundle.classes else {}
    return export_mar_folder(bundle.target, bundle.draft, bundle.tokenizer, out, bundle.image_size,
                             bundle.decoding_defaults, extra, force=force)
