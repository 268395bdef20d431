"""The torch backend: the graph modules of :mod:`vvs.export.graphs`, run eagerly (CPU or CUDA)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vvs.engines.base import EngineSet
from vvs.export.graphs import DraftTreeGraph, build_graphs
from vvs.export.spec import GraphSpec, draft_tree_spec, graph_specs
from vvs.models.bundle import ModelBundle
from vvs.models.layers import cast_floating
from vvs.runtime.options import DecodeOptions, TreeShape


class TorchEngine:
    def __init__(self, module: nn.Module, spec: GraphSpec):
        self.module, self.spec = module, spec

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        self.spec.check_inputs(inputs)
        with torch.inference_mode():
            outputs = self.module(*(inputs[name] for name in self.spec.input_names))
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return dict(zip(self.spec.output_names, outputs))


def torch_engines(bundle: ModelBundle, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  max_draft_top_k: int = 10, default_options: dict | None = None) -> EngineSet:
    device = torch.device(device)
    tree = DecodeOptions.from_dict(default_options or {}).tree
    graphs = build_graphs(bundle.target, bundle.drafter, bundle.vq, tree)
    for module in graphs.values():
        cast_floating(module.to(device), dtype)
    act = "float16" if dtype == torch.float16 else "float32"
    specs = graph_specs(bundle.target.config, bundle.drafter.config, bundle.vq.config, tree, act)

    def tree_loader(shape: TreeShape) -> TorchEngine:  # any shape: the module shares the drafter's weights
        module = DraftTreeGraph(bundle.drafter, graphs["draft_tree"].propose.head, shape,
                                bundle.target.config.max_positions - 1).eval()
        return TorchEngine(module, draft_tree_spec(bundle.target.config, bundle.drafter.config, shape, act))

    engines = EngineSet(
        backend="torch",
        target=bundle.target.config,
        drafter_layers=bundle.drafter.config.num_hidden_layers,
        graphs={name: TorchEngine(graphs[name], specs[name]) for name in specs},
        codebook=bundle.vq.quantize.codebook().detach().to(device),
        device=device,
        dtype=dtype,
        max_draft_top_k=max_draft_top_k,
        default_options=dict(default_options or {}),
        null_condition=(None if bundle.target.config.model_type == "c2i"
                        else bundle.target.cls_embedding.uncond_embedding.detach().clone()),
        tree_loader=tree_loader,
    )
    engines.trees[tree] = engines.graphs["draft_tree"]
    return engines


def torch_text_encoder(text_dir: Path, slots: int, device: str | torch.device = "cpu"):
    """Prompts -> captions with the ``transformers`` T5 folder ``text_dir`` (config, weights, tokenizer.json) run
    eagerly: an engine folder's ``text/``, or an encoder folder before any export (training)."""
    from tokenizers import Tokenizer
    from transformers import T5EncoderModel

    from vvs.export.spec import text_encode_spec
    from vvs.text.encoder import TextEncoder
    from vvs.text.export import EncoderGraph

    device = torch.device(device)
    encoder = T5EncoderModel.from_pretrained(str(text_dir), dtype=torch.float32).to(device).eval()
    graph = TorchEngine(EncoderGraph(encoder), text_encode_spec(slots, encoder.config.d_model))
    return TextEncoder(Tokenizer.from_file(str(Path(text_dir) / "tokenizer.json")), graph, slots, device)


def load_torch_folder(folder, device="cpu", threads: int | None = None, cuda_graphs: bool = False) -> EngineSet:
    """The torch backend over an engine folder's stored weights (same defaults and tables as the graphs)."""
    from safetensors.torch import load_file

    from vvs.engines.manifest import CALIBRATION, TORCH_WEIGHTS, read_manifest, verify_files
    from vvs.models.loading import load_drafter, load_gpt, load_vq
    from vvs.text.export import TEXT_DIR

    folder = Path(folder)
    manifest = read_manifest(folder)
    text_files = [name for name in manifest["files"] if name.startswith(f"{TEXT_DIR}/")]
    verify_files(folder, manifest, list(TORCH_WEIGHTS.values()) + [manifest["tables"]["file"]] + text_files)
    if threads:
        torch.set_num_threads(threads)
    target = load_gpt(folder / TORCH_WEIGHTS["target"])
    if manifest["precision"] == "int8":  # rebuild the quantized target from the stored calibration
        from vvs.calib.int8 import quantize_target

        verify_files(folder, manifest, [CALIBRATION])
        target = quantize_target(target, load_file(folder / CALIBRATION))
    bundle = ModelBundle(target, load_drafter(folder / TORCH_WEIGHTS["drafter"], target.config),
                         load_vq(folder / TORCH_WEIGHTS["vq"]))
    dtype = torch.float16 if manifest["precision"] in ("fp16", "int8") else torch.float32
    engines = torch_engines(bundle, device, dtype, manifest["max_draft_top_k"], manifest["decoding_defaults"])
    engines.neighbour_table = load_file(folder / manifest["tables"]["file"])["neighbours"].to(engines.device)
    if "text" in manifest:
        engines.text = torch_text_encoder(folder / TEXT_DIR, target.config.cls_token_num, engines.device)
    if cuda_graphs:
        from vvs.engines.cuda_graphs import capture_graphs

        capture_graphs(engines)
    return engines
