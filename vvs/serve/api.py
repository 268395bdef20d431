"""The HTTP JSON API, apart from the server that carries it.

``POST /v1/generate`` with ``Content-Type: application/json``::

    {"conditions": [class ids] | ["prompt", ...] | [[[caption embedding] * C] * n],   # required
     "caption_mask": [[bool] * C] * n,                 # with caption embeddings (text-conditional models only)
     "mode": "vvs", "seed": 0 | [s1, s2, ...], "options": {"temperature": 1.0, ...},
     "timeout": seconds, "decode": true}

answers ``{"images": [base64 PNG, ...], "tokens": [[ids], ...], "stats": [{...}, ...], "options": {...}}``
(``images`` is omitted with ``"decode": false``). Every refusal is ``{"error": "one line"}`` with a 4xx or 5xx
status: 400 bad JSON or values, 404/405 unknown route or method, 413 too many images or too large a body, 415 not
JSON, 503 queue full or the service stopping (retry), 504 timed out.
"""
from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, fields

import torch

from vvs.errors import VVSError, json_value
from vvs.runtime.pipeline import Generation

FIELDS = ("conditions", "caption_mask", "mode", "seed", "options", "timeout", "decode")


@dataclass(frozen=True)
class ServedModel:
    """What the images API says about, and checks against, the folder a service holds."""
    id: str  # "<family>-<c2i|t2i>"
    image_size: int  # 0: not recorded in the folder (exported before vvs recorded it); any size is taken
    text_conditional: bool
    max_images: int
    options: type  # the family's decoding options dataclass

    @property
    def size(self) -> str:
        return f"{self.image_size}x{self.image_size}"

    def listing(self) -> dict:
        return {"object": "list", "data": [{"id": self.id, "object": "model", "created": 0, "owned_by": "vvs"}]}


class ApiError(VVSError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class GenerateRequest:
    conditions: object  # list of class ids, list of prompts, or a float tensor of captions
    caption_mask: torch.Tensor | None
    mode: str | None
    seed: int | list[int]
    options: dict
    timeout: float | None
    decode: bool

    @property
    def images(self) -> int:
        return len(self.conditions)


def json_object(body: bytes, content_type: str | None, fields: tuple[str, ...]) -> dict:
    """A request body that must be a JSON object (``fields``: what it may hold, for the message)."""
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, got {content_type or 'none'}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"malformed JSON: {err}") from None
    except RecursionError:
        raise ApiError(400, "JSON nested too deeply for a generate request") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object with {', '.join(fields)}")
    return data


def parse_generate(body: bytes, content_type: str | None, served: ServedModel) -> GenerateRequest:
    """Check the shape of a request; the values are checked by the Pipeline (``OptionsError``: a 400)."""
    data = json_object(body, content_type, FIELDS)
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    conditions = data.get("conditions")
    if not isinstance(conditions, list) or not conditions:
        raise ApiError(400, "conditions: give a non-empty list (class ids, prompts, or caption embeddings)")
    if len(conditions) > served.max_images:
        raise ApiError(413, f"{len(conditions)} images requested; this server takes at most {served.max_images} per "
                            "request")
    options = data.get("options", {})
    if not isinstance(options, dict):
        raise ApiError(400, "options must be a JSON object of decoding options")
    known = [f.name for f in fields(served.options) if f.name != "mode"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ApiError(400, f"unknown option(s) {', '.join(unknown)}; known: {', '.join(known)} (mode is a field of "
                            "its own)")
    timeout = data.get("timeout")  # checked by the Pipeline, as every value
    decode = data.get("decode", True)
    if not isinstance(decode, bool):
        raise ApiError(400, f"decode must be true or false, got {json_value(decode)}")
    mode = data.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise ApiError(400, f"mode must be a string, got {json_value(mode)}")
    mask = None
    if any(isinstance(c, str) for c in conditions):  # prompts or class names: the Pipeline checks them
        if "caption_mask" in data:
            raise ApiError(400, "caption_mask goes with caption embeddings, not with prompts")
    elif served.text_conditional:
        if not all(isinstance(c, list) for c in conditions):
            raise ApiError(400, f"conditions: got {json_value(conditions)}, but this model is text-conditional; "
                                "give prompts (strings), or caption embeddings [n, C, D] with caption_mask")
        if "caption_mask" not in data:
            raise ApiError(400, "caption_mask: caption embeddings need their mask [n, C] (true for the valid slots)")
        conditions = _tensor(conditions, torch.float32, "conditions")
        mask = _tensor(data["caption_mask"], torch.bool, "caption_mask")
    elif "caption_mask" in data:
        raise ApiError(400, "caption_mask: this model is class-conditional; give class ids or names only")
    return GenerateRequest(conditions, mask, mode, data.get("seed", 0), options, timeout, decode)


def _tensor(value, dtype, name: str) -> torch.Tensor:
    try:
        return torch.tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError):
        raise ApiError(400, f"{name}: expected a rectangular nested list of "
                            f"{'numbers' if dtype.is_floating_point else 'booleans'}") from None


def generation_response(gen: Generation) -> dict:
    out = {"tokens": gen.tokens.tolist(),
           "stats": stats_records(gen),
           "options": gen.options.to_dict()}
    if gen.images is not None:
        out["images"] = [png_base64(image) for image in gen.pil_images()]
    return out


def stats_records(gen: Generation) -> list[dict]:
    """Each image's statistics as JSON, without the per-cycle trace."""
    return [{k: v for k, v in s.to_dict().items() if k != "trace"} for s in gen.stats]


def png_base64(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")
