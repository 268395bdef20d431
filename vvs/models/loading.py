"""Safe checkpoint loading and saving, shared by every family's loaders (and the VQ tokenizer's).

Only two readers exist: safetensors, and ``torch.load(weights_only=True)`` for the official ``.pt``/``.bin``
files (their training ``args`` are an ``argparse.Namespace``, the one non-tensor class we allow). Every problem
becomes a :class:`CheckpointError` whose message is one line naming the file and what is wrong with it.

Formats understood:
- official LlamaGen GPT / VQ ``.pt``: a dict holding the weights under ``model`` (or ``ema``, ``module``,
  ``state_dict``), keys possibly prefixed with ``module.``;
- LANTERN / EAGLE drafter folders: ``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``;
- vvs safetensors: weights plus the model config in the safetensors metadata (``vvs_kind``, ``vvs_config``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from vvs.errors import VVSError, json_value
from vvs.files import follow_umask
from vvs.models.vq import VQConfig, VQModel


class CheckpointError(VVSError):
    """A checkpoint that cannot be used. ``str(err)`` is one line: ``<file>: <problem>``."""

    def __init__(self, path: os.PathLike | str, problem: str):
        super().__init__(f"{path}: {problem}")


def check_config_values(path, data: dict, sizes: tuple[str, ...], numbers: tuple[str, ...] = ()) -> None:
    """A config's ``sizes`` as positive integers and its ``numbers`` (norm epsilons, RoPE bases) as positive finite
    numbers, checked before any arithmetic on them, so that a wrong value ("64" for 64, 0 heads) is a one-line
    :class:`CheckpointError`. An absent or null key is left to the reader's defaults."""
    for key in sizes:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise CheckpointError(path, f"{key} is {json_value(value)}, not a positive integer; fix the file")
    for key in numbers:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise CheckpointError(path, f"{key} is {json_value(value)}, not a positive number; fix the file")


# --------------------------------------------------------------------------- reading files


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        return load_file(path), meta
    except (SafetensorError, ValueError, OSError) as err:
        raise CheckpointError(path, f"not a readable safetensors file (truncated or corrupt?): {err}") from None


def _read_pickle(path: Path) -> object:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise CheckpointError(path, f"cannot read it ({err.strerror or err})") from None
    if not head:
        raise CheckpointError(path, "an empty file, not a checkpoint")
    # torch.save writes a zip archive (since torch 1.6) or, before, a pickle whose first opcode is PROTO (0x80)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        kind = "a PNG image" if head == b"\x89PNG" else "text" if _looks_like_text(path) else "some other file"
        raise CheckpointError(path, f"not a checkpoint ({kind}): give a .pt / .pth / .bin file written by torch.save, "
                                    "or a .safetensors file")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "unpickling failed"
        if "weights only" in str(err).lower() or "unsupported global" in str(err).lower():
            raise CheckpointError(
                path, "refused: the file contains pickled Python objects, not just tensors (re-save it as safetensors)"
            ) from None
        raise CheckpointError(path, f"not a readable checkpoint (truncated or corrupt?): {first}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(path, f"not a readable checkpoint (truncated or corrupt?): {first}") from None


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start > len(head) - 4  # a character cut at the end of the sample
    return b"\0" not in head


def read_checkpoint(path: os.PathLike | str, *, ema: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a state dict (and vvs metadata, if any) from a safetensors or official torch file."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(path, "a folder, not a checkpoint file: give the weights file itself")
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    obj = _read_pickle(path)
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"expected a dict of tensors, found {type(obj).__name__}")
    # LlamaGen stores EMA weights under 'ema', MAR under 'model_ema'
    wanted = ("ema", "model_ema") if ema else ("model", "module", "state_dict")
    if ema and not any(k in obj for k in wanted):
        raise CheckpointError(path, "asked for EMA weights but the file has no 'ema' or 'model_ema' entry")
    for key in wanted:
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    state = {k.removeprefix("module."): v for k, v in obj.items()}
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(path, f"entry {bad[0]!r} is not a tensor (expected a state dict)")
    return state, {}


WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's weights, from one file or the shards its index lists."""
    index = next((folder / n for n in WEIGHT_INDEXES if (folder / n).is_file()), None)
    if index is not None:
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(index, f"not a weight index (weight_map of key -> shard): {err}") from None
        files = [folder / s for s in shards]
    else:
        single = next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None)
        if single is None:
            raise CheckpointError(folder, f"no weights: expected {' or '.join(WEIGHT_FILES)}, or an index "
                                          f"({' / '.join(WEIGHT_INDEXES)}) with its shards")
        files = [single]
    state: dict[str, torch.Tensor] = {}
    for file in files:
        part, _ = read_checkpoint(file)
        state.update(part)
    return state


def _names(keys, limit=3) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_state(module: nn.Module, state: dict[str, torch.Tensor], path, hint: str = "") -> None:
    """``load_state_dict(strict=True)`` with the differences explained in one line."""
    expected = module.state_dict()
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s) ({_names(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s) ({_names(unexpected)})")
        raise CheckpointError(path, "; ".join(parts) + (f" — {hint}" if hint else ""))
    wrong = [k for k in expected if expected[k].shape != state[k].shape]
    if wrong:
        k = wrong[0]
        raise CheckpointError(
            path,
            f"{len(wrong)} tensor(s) have the wrong shape, e.g. {k}: file {list(state[k].shape)} vs model "
            f"{list(expected[k].shape)}" + (f" — {hint}" if hint else ""),
        )
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


# --------------------------------------------------------------------------- model loaders


def config_from_meta(meta: dict[str, str], kind: str, path) -> dict | None:
    if "vvs_config" not in meta:
        return None
    if meta.get("vvs_kind") != kind:
        raise CheckpointError(path, f"this is a vvs {meta.get('vvs_kind')!r} file, not a {kind!r} file")
    return json.loads(meta["vvs_config"])


def load_vvs_model(path, kind: str, config_class: type, model_class: type, config=None, *, label: str,
                   instead: str) -> nn.Module:
    """A model from a vvs safetensors file of ``kind`` (its config inside), in eval mode. ``config``: what the
    caller expects (a mismatch is an error); ``label`` and ``instead`` word the error for a file of another kind:
    ``not a vvs {label} file; {instead}``."""
    state, meta = read_checkpoint(path)
    stored = config_from_meta(meta, kind, path)
    if stored is None:
        raise CheckpointError(path, f"not a vvs {label} file; {instead}")
    stored = config_class(**stored)
    if config is not None and config != stored:
        raise CheckpointError(path, "the file's config does not match the requested one")
    model = model_class(stored)
    load_state(model, state, path)
    return model.eval()


def load_vq(path, config: VQConfig | None = None, *, ema: bool = False) -> VQModel:
    state, meta = read_checkpoint(path, ema=ema)
    stored = config_from_meta(meta, "vq", path)
    if stored is not None:
        config = VQConfig(**stored)
    if config is None:
        raise CheckpointError(path, "an official VQ checkpoint carries no config: pass --vq-config (e.g. VQ-16)")
    model = VQModel(config)
    book = state.get("quantize.embedding.weight")
    hint = ""
    if book is not None:
        hint = (f"the file's codebook is {list(book.shape)}, the config expects "
                f"[{config.codebook_size}, {config.codebook_embed_dim}]")
    load_state(model, state, path, hint)
    return model.eval()


# --------------------------------------------------------------------------- saving


def save_model(model: nn.Module, path, kind: str, extra: dict[str, str] | None = None) -> Path:
    """Write a vvs safetensors file (weights + config), atomically: a crash never leaves a half-written file."""
    path = Path(path)
    meta = {"vvs_kind": kind, "vvs_config": json.dumps(model.config.to_dict()), **(extra or {})}
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, tmp, metadata=meta)
    follow_umask(tmp)
    os.replace(tmp, path)
    return path
