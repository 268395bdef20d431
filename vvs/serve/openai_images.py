"""OpenAI's images API on vvs-serve, so that the clients, SDKs and UIs that speak it need no adapter.

``POST /v1/images/generations`` takes OpenAI's body::

    {"prompt": "a red bird",            # required: a text-to-image folder's prompt, or a class name or id as text
     "model": "llamagen-t2i",           # optional; one of GET /v1/models
     "n": 1, "size": "256x256",         # the folder's own size only
     "response_format": "b64_json",     # the images are in the answer; "url" is refused
     "user": "...",                     # accepted and ignored
     "mode": "vvs", "seed": 0, "timeout": 60, "temperature": 1.0, ...}   # vvs's own fields, at the top level

(the ``openai`` client sends vvs's fields with ``extra_body``) and answers
``{"created": unix seconds, "data": [{"b64_json": PNG}, ...], "vvs": {"options": {...}, "stats": [...]}}``; the
``n`` images share the prompt and take the seeds ``seed``, ``seed + 1``, ... ``GET /v1/models`` lists the one model
a service holds. Errors are OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``, with the
status codes of ``POST /v1/generate``.
"""
from __future__ import annotations

import time
from dataclasses import fields

from vvs.errors import json_value
from vvs.serve.api import ApiError, GenerateRequest, ServedModel, json_object, png_base64, stats_records

OPENAI_FIELDS = ("prompt", "model", "n", "size", "response_format", "user")
VVS_FIELDS = ("mode", "seed", "timeout")


class OpenAIError(ApiError):
    """A refusal that names the request field it is about (OpenAI's ``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(status, message)
        self.param = param


def parse_images_request(body: bytes, content_type: str | None, served: ServedModel) -> GenerateRequest:
    """An images request as vvs's own: ``n`` copies of the prompt (the Pipeline reads a class-conditional
    folder's prompt as a class name or id), the vvs fields, and the decoding options given at the top level."""
    option_names = tuple(f.name for f in fields(served.options) if f.name != "mode")
    # a null field is an absent one: many SDKs send every field they know, unset ones as null
    data = {k: v for k, v in json_object(body, content_type, OPENAI_FIELDS).items() if v is not None}
    unknown = sorted(set(data) - {*OPENAI_FIELDS, *VVS_FIELDS, *option_names})
    if unknown:
        raise OpenAIError(400, f"unknown field(s) {', '.join(unknown)}; this service takes OpenAI's "
                               f"{', '.join(OPENAI_FIELDS)}, and vvs's {', '.join(VVS_FIELDS)} and decoding options "
                               f"({', '.join(option_names)})", unknown[0])
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        kind = "a prompt" if served.text_conditional else "a class name or id (this model is class-conditional)"
        raise OpenAIError(400, f"prompt: give {kind} as a non-empty string, got {json_value(prompt)}", "prompt")
    if "model" in data and data["model"] != served.id:
        raise OpenAIError(404, f"model {json_value(data['model'])}: this service serves {served.id!r} only "
                               "(GET /v1/models)", "model")
    n = data.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OpenAIError(400, f"n: give a whole number of images, 1 or more, got {json_value(n)}", "n")
    if n > served.max_images:
        raise OpenAIError(413, f"n: {n} images requested; this server takes at most {served.max_images} per "
                               "request", "n")
    size = data.get("size", served.size)
    if served.image_size and size not in (served.size, "auto"):
        raise OpenAIError(400, f"size {json_value(size)}: this model paints {served.size} only; send size "
                               f"{served.size!r} or leave it out", "size")
    if data.get("response_format", "b64_json") != "b64_json":
        raise OpenAIError(400, f"response_format {json_value(data['response_format'])}: this service returns the "
                               "images in the answer only; send response_format 'b64_json'", "response_format")
    mode = data.get("mode")
    if "mode" in data and not isinstance(mode, str):
        raise OpenAIError(400, f"mode must be a string, got {json_value(mode)}", "mode")
    options = {name: data[name] for name in option_names if name in data}
    return GenerateRequest([prompt] * n, None, mode, data.get("seed", 0), options, data.get("timeout"), True)


def images_response(gen) -> dict:
    return {"created": int(time.time()),
            "data": [{"b64_json": png_base64(image)} for image in gen.pil_images()],
            "vvs": {"options": gen.options.to_dict(),
                    "stats": stats_records(gen)}}


ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error", 503: "server_error", 504: "server_error"}


# vvs's request fields that an images request fills from a field of OpenAI's
OPENAI_PARAMS = {"conditions": "prompt"}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": OPENAI_PARAMS.get(param, param), "code": None}}
