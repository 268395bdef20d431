"""One copy of a folder's weights: every graph of an engine folder names its tensors in one external-data file,
:data:`WEIGHTS_FILE`, where each distinct tensor is stored once.

Why: the target's prefill and verify graphs are traced from the same module, and a drafter may multiply by the
target's head, so per-graph files held the same matrices two or three times (a Janus-Pro-1B folder: 11 GB of graph
data for 5.5 GB of weights). Tensors are identified by their bytes (sha256), not by name: that holds for whatever
form a graph stores them in (float, ``MatMulNBits`` codes and scales, Q/DQ integers), and a tensor shared across
graphs under two names is still found. ONNX's external-data format lets any initialiser point at any offset of any
file, so each graph keeps its own names and only its pointers change; TensorRT's parser and ONNX Runtime read the
graphs as they read any graph with external data.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

WEIGHTS_FILE = "weights.data"
ALIGN = 64  # each tensor's offset: what vectorised kernels reading it in place want
INLINE_BYTES = 1024  # smaller tensors stay in their graph (shapes, scalars, masks)
CHUNK = 1 << 24  # a tensor is copied in pieces, so sharing never holds a whole matrix


def share_weights(folder: Path, graphs: list[Path]) -> list[Path]:
    """Move the tensors of ``graphs`` (files of ``folder``, inline or with their own external data) into
    ``folder/WEIGHTS_FILE``, each distinct one once, and point the graphs at it; their former data files are
    removed. Returns the files the graphs now read: themselves and the weights file."""
    stored: dict[bytes, tuple[int, int]] = {}
    former: set[Path] = set()
    with open(folder / WEIGHTS_FILE, "wb") as out:
        for path in graphs:
            model = onnx.load(str(path), load_external_data=False)
            for tensor in model.graph.initializer:
                source = _source(path.parent, tensor)
                if source is None:
                    continue
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    former.add(source[0])
                offset, length = _append(out, _pieces(tensor, source), stored)
                _point(tensor, offset, length)
            onnx.save_model(model, str(path))
    for path in former - {folder / WEIGHTS_FILE}:
        path.unlink()
    return [*graphs, folder / WEIGHTS_FILE]


def _source(folder: Path, tensor: onnx.TensorProto) -> tuple[Path, int, int] | None:
    """Where ``tensor``'s bytes are: its external file, offset and length, or (None, 0, length) for inline raw
    bytes worth moving; None for a tensor that stays in its graph."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        path = folder / info["location"]
        offset = int(info.get("offset", 0))
        return path, offset, int(info.get("length", path.stat().st_size - offset))
    if len(tensor.raw_data) >= INLINE_BYTES:
        return None, 0, len(tensor.raw_data)
    return None


def _pieces(tensor: onnx.TensorProto, source: tuple[Path | None, int, int]):
    path, offset, length = source
    if path is None:
        yield tensor.raw_data
        return
    with open(path, "rb") as f:
        f.seek(offset)
        while length > 0:
            piece = f.read(min(CHUNK, length))
            if not piece:
                raise OSError(f"{path}: ends before the {tensor.name} tensor it should hold")
            length -= len(piece)
            yield piece


def _append(out, pieces, stored: dict[bytes, tuple[int, int]]) -> tuple[int, int]:
    """Write a tensor at the end of ``out`` (aligned), or, when its bytes are already there, take it back and
    return the earlier copy's (offset, length)."""
    start = -(-out.tell() // ALIGN) * ALIGN
    out.write(b"\0" * (start - out.tell()))
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
        out.write(piece)
    length = out.tell() - start
    key = digest.digest() + length.to_bytes(8, "little")
    if key in stored:
        out.seek(start)
        out.truncate()
        return stored[key]
    stored[key] = (start, length)
    return start, length


def _point(tensor: onnx.TensorProto, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS_FILE), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


def weight_bytes(folder: Path, graph_files: list[str]) -> int:
    """The bytes of the distinct tensors the graphs multiply by, each stored place counted once: what a folder
    must hold, and what a run needs resident at the least. A folder of separate graph files counts a tensor once
    per file that stores it, as it is held."""
    places: set[tuple] = set()
    inline = 0
    for name in graph_files:
        model = onnx.load(str(Path(folder) / name), load_external_data=False)
        for tensor in model.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in tensor.external_data}
                places.add((str(Path(name).parent / info["location"]), info.get("offset", "0"), int(info["length"])))
            else:
                inline += tensor.ByteSize()
    return inline + sum(length for *_, length in places)


def graph_parameters(folder: Path, graph_files: list[str], prefix: str, shapes: dict[str, tuple]) -> dict:
    """The parameters ``shapes`` (name -> shape) of the model a graph module holds at ``prefix``, read back from the
    graphs that store them, as the graphs multiply by them: a matrix stored transposed turned back, a weight-only
    matrix dequantised. One tensor is read at a time. Names no graph stores are left out (the caller says why
    they are needed)."""
    import torch
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor

    import numpy as np

    from vvs.export.row_int8 import CODES, SCALES
    from vvs.export.weight_only import as_float, integers_and_scales, node_attributes

    def array(tensor):  # its bytes read into the tensor itself, so the weight-only readers take it as it is
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            load_external_data_for_tensor(tensor, str(folder))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
        return numpy_helper.to_array(tensor)

    found: dict[str, torch.Tensor] = {}
    for name in graph_files:
        model = onnx.load(str(Path(folder) / name), load_external_data=False)
        inits = {t.name: t for t in model.graph.initializer}
        for param in shapes:
            for suffix in ("", "_transpose"):  # as the module holds it, or as a MatMul's folded Transpose wrote it
                if param not in found and prefix + param + suffix in inits:
                    values = array(inits[prefix + param + suffix])
                    found[param] = torch.from_numpy((values.T if suffix else values).copy())
        for node in (n for n in model.graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith(prefix)):
            param = node.input[1][len(prefix):].rsplit("_Q", 1)[0]
            if param in shapes and param not in found:
                for part in node.input[1:3]:
                    array(inits[part])
                weight, scale = integers_and_scales(node, inits)
                values = numpy_helper.to_array(as_float(weight, scale, node_attributes(node)["block_size"]))
                # values [K, N]: what the MatMul multiplies by, a Linear's matrix transposed (square: a Linear's)
                linear = tuple(values.T.shape) == tuple(shapes[param])
                found[param] = torch.from_numpy((values.T if linear else values).copy())
        for node in (n for n in model.graph.node if n.op_type == "MatMulInteger" and n.input[1].startswith(prefix)):
            param = node.input[1][len(prefix):].removesuffix(CODES)
            if param in shapes and param not in found:
                codes, scales = array(inits[node.input[1]]), array(inits[prefix + param + SCALES])
                values = codes.astype(np.float32) * scales  # [K, N], as the product multiplies by it
                linear = tuple(values.T.shape) == tuple(shapes[param])
                found[param] = torch.from_numpy(np.ascontiguousarray(values.T if linear else values))
    return found
