"""The engine sets of the discrete-token families (their target architecture comes from the manifest's family,
:mod:`vvs.discrete.arch`): the torch modules of a bundle, or an engine folder on ONNX Runtime, OpenVINO,
TensorRT or the torch backend, each as the :class:`~vvs.engines.base.EngineSet` the shared speculative loop runs
on."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.folder_models import folder_drafter, folder_target
from vvs.discrete.graphs import DraftTreeGraph, build_graphs, draft_tree_spec, graph_specs
from vvs.engines.base import EngineSet, check_fit, folder_graphs
from vvs.engines.manifest import CALIBRATION, TORCH_WEIGHTS, verify_files
from vvs.engines.torch_backend import TorchEngine
from vvs.export.spec import DTYPE_NAMES
from vvs.families.registry import family_of
from vvs.models.layers import cast_floating
from vvs.runtime.options import DecodeOptions, TreeShape


def load_engines(folder: Path, manifest: dict, backend: str, device: str | None, threads: int | None,
                 cuda_graphs: bool) -> EngineSet:
    """An engine folder with a backend. ``auto``: TensorRT (then TensorRT-RTX) plans if built and the module is
    installed, else ONNX Runtime (CUDA when onnxruntime-gpu and a GPU are present, else CPU)."""
    if backend == "auto":
        from vvs.engines.tensorrt_backend import ready_flavour

        backend = ready_flavour(manifest) or "onnxruntime"
    if backend in ("tensorrt", "tensorrt-rtx"):
        return load_tensorrt(folder, device or "cuda", cuda_graphs=cuda_graphs, backend=backend)
    if backend == "openvino":
        return load_openvino(folder, device, threads)
    if backend == "torch":
        return load_torch_folder(folder, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                                 threads=threads, cuda_graphs=cuda_graphs)
    import onnxruntime as ort

    default = "cuda" if torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    return load_onnxruntime(folder, device or default, threads=threads)


def check_folder_options(manifest: dict, backend: str, opts: DecodeOptions) -> None:
    """What :meth:`EngineSet.check_options` checks, from the folder's manifest alone (before anything is loaded)."""
    target = family_of(manifest).entry("target_arch").config(**manifest["model"]["target"])
    neighbours = None if backend == "torch" else manifest["tables"]["neighbours_per_code"]
    check_fit(opts, target, "draft_tree" in manifest["graphs"], manifest["max_draft_top_k"], backend, neighbours)


def engine_set(backend: str, folder: Path, manifest: dict, graphs: dict, device) -> EngineSet:
    """The :class:`EngineSet` of a folder's graphs: configs, tables and defaults from the manifest."""
    from safetensors.torch import load_file

    from vvs.text.encoder import folder_text_encoder

    tables = load_file(Path(folder) / manifest["tables"]["file"])
    act = next(t for t in graphs["target_verify"].spec.inputs if t.name == "past_kv").dtype
    arch = family_of(manifest).entry("target_arch")
    target = arch.config(**manifest["model"]["target"])
    engines = EngineSet(
        backend=backend,
        target=target,
        drafter_layers=manifest["model"].get("drafter", {}).get("num_hidden_layers", 0),
        graphs=graphs,
        codebook=tables["codebook"].to(device),
        device=device,
        dtype=torch.float16 if act == "float16" else torch.float32,
        max_draft_top_k=manifest["max_draft_top_k"],
        conditioning=arch.conditioning(target, tables, manifest["model"], prompt_tokenizer(folder, manifest)),
        neighbour_table=tables["neighbours"].to(device),
        default_options=manifest["decoding_defaults"],
        token_layout=arch.token_layout and arch.token_layout(target),
    )
    if "draft_tree" in graphs:
        engines.trees[TreeShape(*manifest["graphs"]["draft_tree"]["tree"])] = graphs["draft_tree"]
    engines.text = folder_text_encoder(folder, manifest, backend, graphs.get("text_encode"), device)
    return engines


def prompt_tokenizer(folder: Path, manifest: dict) -> Path | None:
    """The folder's copy of the target's own tokenizer, for a family whose target reads prompt ids (Janus-Pro)."""
    if "prompts" not in manifest:
        return None
    path = Path(folder) / manifest["prompts"]["tokenizer"]
    verify_files(folder, manifest, [manifest["prompts"]["tokenizer"]])
    return path


def load_onnxruntime(folder: str | Path, device: str = "cpu", threads: int | None = None) -> EngineSet:
    from vvs.discrete.exporter import export_tree
    from vvs.engines.manifest import read_manifest
    from vvs.engines.onnxruntime_backend import open_graphs, open_session, session_options

    folder, device = Path(folder), torch.device(device)
    manifest = read_manifest(folder)
    engines = engine_set("onnxruntime", folder, manifest, open_graphs(folder, manifest, folder_graphs(manifest),
                                                                      device, threads), device)
    options = session_options(threads)
    if engines.has_drafter:
        engines.tree_loader = lambda tree: open_session(*export_tree(folder, manifest, tree), device, options=options)
    return engines


def load_openvino(folder: str | Path, device: str | None = None, threads: int | None = None) -> EngineSet:
    import openvino as ov

    from vvs.discrete.exporter import export_tree
    from vvs.engines.manifest import read_manifest
    from vvs.engines.openvino_backend import check_device, open_graphs, open_model

    folder, device = Path(folder), check_device(device)
    manifest = read_manifest(folder)
    engines = engine_set("openvino", folder, manifest, open_graphs(folder, manifest, folder_graphs(manifest), threads),
                         device)
    if engines.has_drafter:
        core = ov.Core()
        engines.tree_loader = lambda tree: open_model(core, *export_tree(folder, manifest, tree), threads)
    return engines


def load_tensorrt(folder: str | Path, device: str = "cuda", cuda_graphs: bool = False, backend: str = "tensorrt",
                  trt=None) -> EngineSet:
    from vvs.engines.manifest import read_manifest
    from vvs.engines.tensorrt_backend import open_plans
    from vvs.engines.tensorrt_build import flavour

    folder, device = Path(folder), torch.device(device)
    manifest = read_manifest(folder)
    graphs, cache = open_plans(folder, manifest, folder_graphs(manifest), device, backend, trt)
    engines = engine_set(flavour(backend).name, folder, manifest, graphs, device)
    if cache:
        engines.on_close.append(cache.save)
    if cuda_graphs:
        from vvs.engines.cuda_graphs import GraphedEngine

        for name in ("target_verify", "draft_tree")[: 1 + engines.has_drafter]:
            bucketed = engines.graphs[name]
            bucketed.inner = GraphedEngine(bucketed.inner)
        engines.backend += "+cuda-graphs"
    return engines


def torch_engines(bundle: ModelBundle, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  max_draft_top_k: int = 10, default_options: dict | None = None) -> EngineSet:
    device = torch.device(device)
    tree = DecodeOptions.from_dict(default_options or {}).tree
    graphs = build_graphs(bundle.target, bundle.drafter, bundle.vq, tree)
    for module in graphs.values():
        cast_floating(module.to(device), dtype)
    act = DTYPE_NAMES[dtype]
    specs = graph_specs(bundle.target.config, bundle.drafter and bundle.drafter.config, bundle.vq.config, tree, act)
    uncond = getattr(getattr(bundle.target, "cls_embedding", None), "uncond_embedding", None)  # LlamaGen t2i only
    tables = {} if uncond is None else {"null_condition": uncond.detach().clone()}

    def tree_loader(shape: TreeShape) -> TorchEngine:  # any shape: the module shares the drafter's weights
        propose = graphs["draft_tree"].propose
        module = DraftTreeGraph(bundle.drafter, propose.head, shape, bundle.target.config.max_positions - 1,
                                propose.mask).eval()
        return TorchEngine(module, draft_tree_spec(bundle.target.config, bundle.drafter.config, shape, act))

    engines = EngineSet(
        backend="torch",
        target=bundle.target.config,
        drafter_layers=0 if bundle.drafter is None else bundle.drafter.config.num_hidden_layers,
        graphs={name: TorchEngine(graphs[name], specs[name]) for name in specs},
        codebook=bundle.vq.quantize.codebook().detach().to(device),
        device=device,
        dtype=dtype,
        max_draft_top_k=max_draft_top_k,
        default_options=dict(default_options or {}),
        conditioning=bundle.arch.conditioning(bundle.target.config, tables, {}, bundle.tokenizer),
        tree_loader=None if bundle.drafter is None else tree_loader,
        token_layout=bundle.arch.token_layout and bundle.arch.token_layout(bundle.target.config),
    )
    if engines.has_drafter:
        engines.trees[tree] = engines.graphs["draft_tree"]
    return engines


def torch_text_encoder(text_dir: Path, slots: int, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32):
    """Prompts -> captions with the ``transformers`` T5 folder ``text_dir`` (config, weights, tokenizer.json) run
    eagerly: an engine folder's ``text/``, or an encoder folder before any export (training)."""
    from tokenizers import Tokenizer
    from transformers import T5EncoderModel

    from vvs.export.spec import text_encode_spec
    from vvs.text.encoder import TextEncoder
    from vvs.text.export import EncoderGraph

    device = torch.device(device)
    encoder = T5EncoderModel.from_pretrained(str(text_dir), dtype=dtype).to(device).eval()
    graph = TorchEngine(EncoderGraph(encoder), text_encode_spec(slots, encoder.config.d_model, DTYPE_NAMES[dtype]))
    return TextEncoder(Tokenizer.from_file(str(Path(text_dir) / "tokenizer.json")), graph, slots, device)


def load_torch_folder(folder, device="cpu", threads: int | None = None, cuda_graphs: bool = False) -> EngineSet:
    """The torch backend over an engine folder's stored weights (same defaults and tables as the graphs)."""
    from safetensors.torch import load_file

    from vvs.engines.manifest import read_manifest
    from vvs.text.export import TEXT_DIR

    folder = Path(folder)
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    if threads:
        torch.set_num_threads(threads)
    arch = family_of(manifest).entry("target_arch")
    target = folder_target(folder, manifest)
    if manifest["precision"] == "int8":  # rebuild the quantized target from the stored calibration
        from vvs.calib.int8 import quantize_target

        verify_files(folder, manifest, [CALIBRATION])
        target = quantize_target(target, arch.int8, load_file(folder / CALIBRATION))
    drafter = folder_drafter(folder, manifest, target.config)
    bundle = ModelBundle(target, drafter, arch.load_vq(folder / TORCH_WEIGHTS["vq"]), manifest["model"]["family"],
                         prompt_tokenizer(folder, manifest))
    dtype = torch.float16 if manifest["precision"] in ("fp16", "int8") else torch.float32
    engines = torch_engines(bundle, device, dtype, manifest["max_draft_top_k"], manifest["decoding_defaults"])
    engines.neighbour_table = load_file(folder / manifest["tables"]["file"])["neighbours"].to(engines.device)
    if "text" in manifest:
        engines.text = torch_text_encoder(folder / TEXT_DIR, target.config.cls_token_num, engines.device)
    if cuda_graphs:
        from vvs.engines.cuda_graphs import capture_graphs

        capture_graphs(engines)
    return engines


def quality_instruments(folder: Path, manifest: dict, classifier):
    """The quality instruments of a folder of the shipped model: the photo classifier, and the folder's own target
    for the NLL column."""
    from vvs.quality import Instruments

    return Instruments(classifier, folder_target(Path(folder), manifest))
