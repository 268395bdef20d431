"""A Python client for ``vvs-serve`` (standard library only)::

    from vvs.serve.client import Client

    result = Client("http://127.0.0.1:8000").generate([0, 3], mode="vvs", seed=0, temperature=1.0)
    result.images[0].save("astronaut.png"); print(result.stats[0]["tokens_per_target_forward"])
"""
from __future__ import annotations

import base64
import io
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message

from vvs.errors import VVSError


class ServeError(VVSError):
    """The server refused or failed a request (``status`` is the HTTP status, 0 when it could not be reached)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


@dataclass
class Result:
    images: list  # PIL images ([] when not decoded)
    tokens: list[list[int]]
    stats: list[dict]
    options: dict
    server_seconds: dict[str, float]  # the replica's phases (Server-Timing): request, tokens, pixels, encode


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 600.0, busy_retries: int = 3):
        """``busy_retries``: how often a 503 (the replica's queue is full) is retried after its Retry-After."""
        self.url, self.timeout, self.busy_retries = url.rstrip("/"), timeout, busy_retries

    def generate(self, conditions, mode: str | None = None, seed: int | list[int] = 0, *, caption_mask=None,
                 decode: bool = True, timeout: float | None = None, **options) -> Result:
        """Arguments as :meth:`vvs.runtime.pipeline.Pipeline.generate` (captions and masks as nested lists)."""
        body = {"conditions": _conditions(conditions), "seed": seed, "options": options, "decode": decode}
        if mode is not None:
            body["mode"] = mode
        if caption_mask is not None:
            body["caption_mask"] = _plain(caption_mask)
        if timeout is not None:
            body["timeout"] = timeout
        data, headers = self._request("POST", "/v1/generate", body)
        from PIL import Image

        images = [Image.open(io.BytesIO(base64.b64decode(png))) for png in data.get("images", [])]
        return Result(images, data["tokens"], data["stats"], data["options"],
                      parse_server_timing(headers.get("Server-Timing", "")))

    def model(self) -> dict:
        return self._request("GET", "/v1/model")[0]

    def health(self) -> dict:
        return self._request("GET", "/healthz")[0]

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[dict, Message]:
        request = urllib.request.Request(self.url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        for attempt in range(self.busy_retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read()), response.headers  # case-insensitive lookups
            except urllib.error.HTTPError as err:
                if err.code == 503 and attempt < self.busy_retries:
                    time.sleep(float(err.headers.get("Retry-After", 1)))
                    continue
                raise ServeError(err.code, _message(err.code, err.read())) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                raise ServeError(0, f"could not reach {self.url}: {getattr(err, 'reason', err)}") from None
        raise AssertionError("unreachable")


def parse_server_timing(header: str) -> dict[str, float]:
    """``name;dur=ms, ...`` -> seconds by name (entries without a duration are left out)."""
    phases = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                try:
                    phases[name] = float(value) / 1000
                except ValueError:
                    pass
    return phases


def _message(status: int, body: bytes) -> str:
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):  # not from vvs: Ray Serve's own answer
        text = body.decode(errors="replace").strip().splitlines()[0] if body.strip() else "no message"
        if status >= 500:
            return (f"{text}: the replica serving the request failed (Ray Serve restarts replicas that die); "
                    "retry the request")
        return text


def _conditions(value) -> list:
    """What ``generate`` sends for its conditions: a string is one prompt, not a list of characters."""
    if isinstance(value, str):
        return [value]
    plain = value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(plain, (list, tuple)):
        raise ServeError(0, f"conditions: give a list of class ids or prompts (a string is one prompt), not "
                            f"{type(value).__name__} {value!r}")
    return list(plain)


def _plain(value):
    """Tensors and arrays as nested lists."""
    return value.tolist() if hasattr(value, "tolist") else list(value)
