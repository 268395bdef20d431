"""``vvs-export --model mar``: a target MAR, a draft MAR and a continuous tokenizer -> an engine folder.

Same folder contract as the LlamaGen exporter (:mod:`vvs.export.exporter`): built under a temporary name and
renamed into place, every file in the manifest with its sha256, the torch weights beside the graphs.
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch
from tqdm import tqdm

from vvs.engines.manifest import FORMAT, MANIFEST, file_record
from vvs.engines.mar import TORCH_WEIGHTS, check_pair
from vvs.export.exporter import folder_transaction, tool_versions
from vvs.export.mar_graphs import build_mar_graphs, mar_graph_specs
from vvs.export.onnx_export import export_graph
from vvs.models.latents import KLLatents
from vvs.models.loading import save_model
from vvs.models.mar import MAR
from vvs.runtime.options import MAROptions


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
