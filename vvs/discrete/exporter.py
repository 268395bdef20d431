"""The engine folder of the discrete-token families (:mod:`vvs.discrete.arch`): a model
bundle -> four ONNX graphs (``target_prefill``, ``target_verify``, ``draft_tree``,
``vq_decode``; no ``draft_tree`` without a drafter), tables and the manifest, written through
:func:`vvs.export.folder.folder_transaction`.

The ``draft_tree`` graph is built for the decoding defaults' tree shape; :func:`export_tree` adds other shapes
to a folder on demand (``vvs-bench --tune`` and ``--sweep`` try several).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import onnx
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.drafter import DrafterConfig
from vvs.discrete.graphs import build_graphs, draft_tree_graph, draft_tree_spec, graph_specs
from vvs.engines.manifest import (CALIBRATION, FORMAT, MANIFEST, REWRITTEN, TABLES, TORCH_WEIGHTS, W8A8_GRAPHS,
                                  file_record, graph_spec, graph_weights)
from vvs.errors import VVSError
from vvs.export.folder import folder_transaction, tool_versions
from vvs.export.onnx_export import export_graph
from vvs.export.shared_weights import WEIGHTS_FILE, share_weights
from vvs.export.weight_only import HEADLESS
from vvs.export.spec import DTYPES, GraphSpec
from vvs.families.registry import family_of
from vvs.models.layers import cast_floating
from vvs.models.loading import save_model
from vvs.runtime.neighbours import nearest_codes
from vvs.runtime.options import DecodeOptions, TreeShape

# the dtype of everything that is not quantized: int8 is W8A8 Q/DQ linears in an otherwise fp16 graph
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.float16}
TREES = "trees"  # draft_tree graphs of other tree shapes, exported on demand
TREE_INDEX = "index.json"  # in TREES: the size and sha256 of every file exported there
PROMPT_TOKENIZER = "tokenizer.json"  # a target's own text tokenizer, where prompts are its input
WEIGHTS = ("fp32", *REWRITTEN)  # --weights
DRAFTER_WEIGHTS = tuple(w for w in WEIGHTS if w not in HEADLESS)  # --drafter-weights
FLOAT_GRAPHS = ("vq_decode",)  # pixels out of codes: no weight-only form, its convolutions are not MatMuls


def export_folder(bundle: ModelBundle, out_dir: Path, precision: str = "fp32", max_draft_top_k: int = 10,
                  neighbours: int | None = None, decoding_defaults: dict | None = None,
                  extra_model_info: dict | None = None, progress: bool = True, force: bool = False,
                  text_encoder: tuple | None = None, weights: str = "fp32", drafter_weights: str | None = None,
                  torch_weights: bool = False) -> dict:
    """Export ``bundle`` into ``out_dir``; returns the manifest. ``neighbours``: LANTERN neighbours stored per
    code (default: the decoding defaults' ``lantern_k``). ``text_encoder``: a t2i target's ``transformers`` T5
    encoder and tokenizer (:func:`vvs.text.export.load_text_encoder`), exported as the ``text_encode`` graph.
    ``weights="int8"``, ``"int4"`` or ``"int4-head8"``: the constant matrices of the target's and the drafter's
    graphs as ONNX Runtime's ``MatMulNBits`` (:mod:`vvs.export.weight_only`); ``drafter_weights``: the same for the
    draft_tree graphs alone (None: as ``weights``, int4 for int4-head8). The graphs store each distinct tensor once,
    in one file (:mod:`vvs.export.shared_weights`); the torch backend reads the target and the drafter back from
    them, or, with ``torch_weights``, from torch files of their own (a second copy: the only way for an int8
    folder's, whose graphs hold SmoothQuant's integers)."""
    if precision not in PRECISIONS:
        raise VVSError(f"option precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    stored = weights_per_graph(weights, drafter_weights, precision, bundle.drafter is not None)
    if precision == "int8" and bundle.arch.int8 is None:
        raise VVSError(f"option --precision int8: vvs has no SmoothQuant layout for {bundle.family}'s target; export "
                       "it as fp32 or fp16")
    defaults = DecodeOptions().updated(**(decoding_defaults or {}))
    if bundle.drafter is None and defaults.uses_drafter:  # the best exact mode that needs no drafter
        defaults = defaults.updated(mode="sjd-pac")
    if defaults.draft_top_k > max_draft_top_k:
        raise VVSError(f"default draft_top_k={defaults.draft_top_k} exceeds max_draft_top_k={max_draft_top_k}")
    vocab = bundle.target.config.vocab_size
    k_nn = min(neighbours or defaults.lantern_k, vocab - 1)
    out_dir = Path(out_dir).resolve()
    with folder_transaction(out_dir, force) as work:
        source = bundle  # what the torch backend will load (int8: the fp32 models plus the calibration)
        if precision == "fp16":  # the torch backend runs the graphs' weights; leave the caller's models as they were
            source = bundle = copy.deepcopy(bundle)
            for model in (bundle.target, bundle.drafter, bundle.vq):
                if model is not None:
                    cast_floating(model, torch.float16)
        if precision == "int8":
            from vvs.calib.int8 import calibrate, int8_bundle

            bundle = int8_bundle(bundle, calibrate(bundle, work / CALIBRATION))
        act = "float16" if PRECISIONS[precision] == torch.float16 else "float32"
        drafter = bundle.drafter and bundle.drafter.config
        specs = graph_specs(bundle.target.config, drafter, bundle.vq.config, defaults.tree, act)
        graphs = build_graphs(bundle.target, bundle.drafter, bundle.vq, defaults.tree)
        graph_files: list[Path] = []
        entries = {}
        steps = tqdm(list(specs), desc="export", unit="graph", disable=not progress, dynamic_ncols=True)
        for name in steps:
            steps.set_postfix_str(name)
            written = export_graph(graphs[name], specs[name], work / f"{name}.onnx", vocab,
                                   bundle.target.config.max_positions - 1, PRECISIONS[precision],
                                   stored[name] if stored[name] in REWRITTEN else None,
                                   on_meta=not (precision == "int8" and name in W8A8_GRAPHS))
            onnx.checker.check_model(str(written[0]))
            graph_files.append(written[0])
            entries[name] = {"file": written[0].name, "spec": specs[name].to_dict(), "weights": stored[name]}
        files = share_weights(work, graph_files)
        if drafter is not None:
            entries["draft_tree"]["tree"] = list(defaults.tree)
        if text_encoder is not None:
            from vvs.text.export import export_text_encoder

            entries["text_encode"], written = export_text_encoder(*text_encoder, work, bundle.target.config.cls_token_num)
            files += written
        tables = {"codebook": bundle.vq.quantize.codebook().detach().float().contiguous(),
                  "neighbours": nearest_codes(bundle.vq.quantize.codebook().detach(), k_nn)}
        if getattr(bundle.target.config, "model_type", None) == "t2i":
            tables["null_condition"] = bundle.target.cls_embedding.uncond_embedding.detach().float().contiguous()
        save_file(tables, work / TABLES)
        files.append(work / TABLES)
        # the tokenizer's torch weights always: its graph holds only the decoder, and the torch backend and
        # vvs-bench --scale load the whole model
        for name, model, kind in (("target", source.target, bundle.arch.kind), ("drafter", source.drafter, "drafter"),
                                  ("vq", source.vq, bundle.arch.vq_kind)):
            if model is not None and (torch_weights or name == "vq"):
                files.append(save_model(model, work / TORCH_WEIGHTS[name], kind))
        if bundle.tokenizer is not None:  # the target reads prompt ids: its own tokenizer travels with it
            files.append(Path(shutil.copyfile(bundle.tokenizer, work / PROMPT_TOKENIZER)))
        if precision == "int8":
            files.append(work / CALIBRATION)
        manifest = {
            "format": FORMAT,
            "model": {
                "family": bundle.family,
                "target": bundle.target.config.to_dict(),
                **({} if drafter is None else {"drafter": drafter.to_dict()}),
                "vq": bundle.vq.config.to_dict(),
                "image_size": bundle.target.config.grid_size * bundle.vq.config.downsample,
                **(extra_model_info or {}),
            },
            "precision": precision,
            "max_draft_top_k": max_draft_top_k,
            "graphs": entries,
            "tables": {"file": TABLES, "neighbours_per_code": k_nn},
            "decoding_defaults": defaults.to_dict(),
            "versions": tool_versions(),
            "files": {p.relative_to(work).as_posix(): file_record(p) for p in files},
        }
        if bundle.tokenizer is not None:
            manifest["prompts"] = {"tokenizer": PROMPT_TOKENIZER}
        if text_encoder is not None:
            from vvs.text.export import TOKENIZER

            manifest["text"] = {"tokenizer": TOKENIZER, "encoder": text_encoder[0].config.name_or_path or "T5"}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


QUANTISED_ON_THE_FLY = "the {} weights multiply float32 activations quantised on the fly"


def check_options(options: dict) -> None:
    """``vvs-export``'s refusals that need no model, made before a checkpoint is loaded (minutes at 7B)."""
    check_weights(options["weights"], options["drafter_weights"], options["precision"])


def check_weights(weights: str, drafter_weights: str | None, precision: str) -> None:
    for option, value, choices in (("--weights", weights, WEIGHTS),
                                   ("--drafter-weights", drafter_weights, DRAFTER_WEIGHTS)):
        if value is not None and value not in choices:
            raise VVSError(f"option {option} {value}: choose one of {', '.join(choices)}")
    if weights != "fp32" and drafter_weights is not None:
        raise VVSError(f"option --drafter-weights {drafter_weights}: --weights {weights} already sets the drafter's "
                       "weights; give --weights alone, or --drafter-weights alone to quantise only the drafter")
    if weights != "fp32" and precision != "fp32":
        raise VVSError(f"option --weights {weights}: needs --precision fp32 ({QUANTISED_ON_THE_FLY.format(weights)}), "
                       f"not --precision {precision}")


def weights_per_graph(weights: str, drafter_weights: str | None, precision: str, has_drafter: bool) -> dict:
    """What each graph's matrices are stored as (the manifest's ``graphs.<name>.weights``), or a one-line refusal
    of a combination that cannot be exported."""
    check_weights(weights, drafter_weights, precision)
    if drafter_weights not in (None, "fp32") and (precision != "fp32" or not has_drafter):
        raise VVSError(f"option --drafter-weights {drafter_weights}: needs a drafter and --precision fp32 "
                       f"({QUANTISED_ON_THE_FLY.format(drafter_weights)})")
    drafter_weights = drafter_weights or HEADLESS.get(weights, weights)
    floating = "fp32" if precision == "fp32" else "fp16"
    target = "w8a8-static" if precision == "int8" else weights if weights != "fp32" else floating
    stored = {name: target for name in W8A8_GRAPHS}
    stored["draft_tree"] = drafter_weights if drafter_weights != "fp32" else floating
    stored.update({name: floating for name in FLOAT_GRAPHS})
    return stored


def export_tree(folder: Path, manifest: dict, tree: TreeShape) -> tuple[Path, GraphSpec]:
    """The ``draft_tree`` graph of ``tree`` for an engine folder, exported once from the folder's own weights
    (:func:`~vvs.discrete.folder_models.folder_target`) into its ``trees/`` subfolder (named after those weights' sha256,
    so a re-exported folder never picks up a stale graph). Each use checks the graph against the size and sha256
    recorded when it was exported, as a folder's own files are checked; a graph that fails (truncated, edited) is
    exported again."""
    from vvs.discrete.folder_models import folder_drafter, folder_target

    folder = Path(folder)
    weights = "".join(manifest["files"][f]["sha256"][:8] for f in source_files(manifest))
    bits = graph_weights(manifest, "draft_tree")
    path = folder / TREES / f"draft_tree-{tree.name}-{weights}{'-' + bits if bits in REWRITTEN else ''}.onnx"
    arch = family_of(manifest).entry("target_arch")
    target = arch.config(**manifest["model"]["target"])
    act = graph_spec(manifest, "draft_tree").inputs[0].dtype
    spec = draft_tree_spec(target, DrafterConfig(**manifest["model"]["drafter"]), tree, act)
    files = _tree_index(path.parent).get(path.name)  # what was recorded when it was exported, if it was
    recorded = isinstance(files, dict) and path.name in files
    damage = _damage(path.parent, files) if recorded else None
    if damage is not None:  # a user should know that a file of their folder changed
        print(f"vvs: {path}: {damage}; exporting it again", file=sys.stderr)
    if damage is not None or not recorded:
        model = folder_target(folder, manifest)
        module = draft_tree_graph(model, folder_drafter(folder, manifest, model.config), tree)
        try:
            _record(path.parent, export_graph(module, spec, path, target.vocab_size, target.max_positions - 1,
                                              DTYPES[act], bits if bits in REWRITTEN else None))
        except OSError as err:
            raise VVSError(f"{path}: cannot write the draft_tree graph for tree {tree.name} ({err.strerror or err}); "
                           "make the engine folder writable, or export it with this tree as a default") from None
    return path, spec


def source_files(manifest: dict) -> list[str]:
    """The files a folder's torch target and drafter are read from: their torch weights, else the graphs' weights
    (and the graphs, which say where each tensor lies)."""
    if TORCH_WEIGHTS["target"] in manifest["files"]:
        return [TORCH_WEIGHTS[m] for m in ("target", "drafter") if TORCH_WEIGHTS[m] in manifest["files"]]
    graphs = [manifest["graphs"][g]["file"] for g in ("target_verify", "draft_tree") if g in manifest["graphs"]]
    return [f for f in manifest["files"] if f == WEIGHTS_FILE or f in graphs or f[:-len(".data")] in graphs]


def _tree_index(trees: Path) -> dict:
    try:
        index = json.loads((trees / TREE_INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _damage(trees: Path, files: dict) -> str | None:
    """What is wrong with a graph's files against the sizes and sha256 recorded when they were exported, or
    None."""
    for name, record in files.items():
        f = trees / name
        try:
            size = f.stat().st_size
            if size != record["bytes"]:
                return f"{name} is {size} bytes, not the {record['bytes']} recorded when it was exported"
            if file_record(f)["sha256"] != record["sha256"]:
                return f"{name} does not match the sha256 recorded when it was exported (edited or damaged)"
        except FileNotFoundError:
            return f"{name} is missing"
        except (OSError, TypeError, KeyError):
            return f"{name} cannot be checked against its record"
    return None


def _record(trees: Path, files: list[Path]) -> None:
    index = _tree_index(trees)
    index[files[0].name] = {p.name: file_record(p) for p in files}
    tmp = trees / f".{TREE_INDEX}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, trees / TREE_INDEX)


def write_defaults(folder: Path, defaults: dict, tuning: dict | None = None) -> None:
    """Replace the folder's default decoding options (``vvs-bench --tune``, which also records what it predicted
    and measured under ``tuning``); only the manifest changes."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["decoding_defaults"] = DecodeOptions().updated(**defaults).to_dict()
    if tuning is not None:
        manifest["tuning"] = tuning
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)


def tensorrt_profiles(manifest: dict, name: str, max_images: int) -> list[dict[str, tuple[tuple, tuple, tuple]]]:
    """One optimisation profile per ``new`` bucket of the graph (:mod:`vvs.engines.buckets`), sized for the
    runtime's cache buffers."""
    from vvs.engines.buckets import PAST_SLACK, buckets
    from vvs.engines.base import TOPK_LIMIT
    from vvs.engines.tensorrt_build import profile_of
    from vvs.runtime.cache import KVCache

    spec = graph_spec(manifest, name)
    target = manifest["model"]["target"]
    opts = DecodeOptions.from_dict(manifest["decoding_defaults"])
    config = family_of(manifest).entry("target_arch").config(**target)
    c, n = config.cls_token_num, config.num_image_tokens
    base = KVCache.slots(c + n + 2 * opts.max_path_tokens)  # the runtime's cache buffers
    past = (c + n, base, c + n + PAST_SLACK) if name in ("target_verify", "draft_tree") else (0, 0, 0)
    news = buckets(name, c, opts) or [0]
    profiles = []
    for new in news:
        ranges = {"batch": (1, 2 * max_images, 2 * max_images), "images": (1, max_images, max_images),
                  "new": (new, new, new), "past": past,
                  "past_plus_new": tuple(p + new for p in past),
                  "survivors_k": ((1,), (1,), (min(config.vocab_size, TOPK_LIMIT),))}
        profiles.append(profile_of(spec, ranges))
    return profiles
