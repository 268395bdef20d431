"""``vvs-serve``: one Ray Serve deployment whose replicas each hold the pipeline the registry gives the folder's family
(:func:`~vvs.families.registry.pipeline_of`).

Ray Serve carries HTTP, spreads requests over replicas (on one machine or a cluster), restarts replicas that
die or fail their health check, autoscales, and exports metrics; each replica merges the requests it is given
into running batches (continuous batching). Routes: ``POST /v1/generate`` (:mod:`vvs.serve.api`),
``GET /v1/model``, OpenAI's ``POST /v1/images/generations`` and ``GET /v1/models``
(:mod:`vvs.serve.openai_images`), ``GET /healthz``, and ``GET /``: a page that shows the modes side by side
(``page.html``).
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import torch
from ray import serve
from ray.util import metrics
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from vvs.engines import load_engines
from vvs.engines.manifest import read_manifest
from vvs.errors import VVSError
from vvs.families.registry import family_of, pipeline_of
from vvs.runtime.options import OptionsError
from vvs.runtime.scheduler import Busy, RequestTimeout
from vvs.serve.api import ApiError, GenerateRequest, ServedModel, generation_response, parse_generate
from vvs.serve.drain import ReplicaDrain
from vvs.serve.openai_images import error_body, images_response, parse_images_request


PAGE = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")
MAX_REQUEST_BYTES = 64 << 20  # a request body; text-conditional requests carry caption embeddings as JSON
STALL_LIMIT_S = 300.0  # far above one decoding cycle (milliseconds on a GPU, about 0.1 s here on 2 CPU cores)


class VVSServer:
    def __init__(self, engine_dir: str, backend: str = "auto", device: str | None = None, threads: int | None = None,
                 max_batch: int = 16, max_queue: int = 256, max_images: int = 64,
                 max_request_bytes: int = MAX_REQUEST_BYTES):
        if threads is not None:  # Ray limits a replica's torch to its CPU reservation (OMP_NUM_THREADS)
            torch.set_num_threads(threads)
        manifest = read_manifest(Path(engine_dir))
        self.pipe = pipeline_of(load_engines(engine_dir, backend, device=device, threads=threads), manifest,
                                max_batch=max_batch, max_queue=max_queue)
        self.max_request_bytes = max_request_bytes
        self.class_names = manifest["model"].get("classes") or []
        family = family_of(manifest)
        text = family.text_conditional(manifest)
        self.prompts = family.takes_prompts(manifest)
        self.num_classes = 0 if text else family.num_classes(manifest)
        self.served = ServedModel(f"{family.name}-{'t2i' if text else 'c2i'}", manifest["model"].get("image_size", 0),
                                  text, max_images, type(self.pipe.options))
        self.modes = [{"name": name, "exact": opts.exact} for name, opts in self._runnable_modes()]
        self.drain = ReplicaDrain()
        self.requests = metrics.Counter("vvs_requests", "Generate requests by outcome.", tag_keys=("status",))
        self.images = metrics.Counter("vvs_images", "Images generated.")
        self.latency = metrics.Histogram("vvs_request_seconds", "Generate request latency (decoded images).",
                                         boundaries=[0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128])

    def _runnable_modes(self):
        """(name, options) of each mode name this folder runs with its defaults (a folder without a drafter runs
        no drafter mode; defaults made for one mode, a short window say, may not fit another)."""
        for name in self.pipe.options.NAMED_MODES:
            try:
                yield name, self.pipe.options_for(name)
            except OptionsError:
                continue

    async def __call__(self, request: Request) -> JSONResponse:
        self.drain.watch()
        routes = {"/v1/generate": ("POST", self.generate), "/v1/model": ("GET", self.model),
                  "/v1/images/generations": ("POST", self.images_generations), "/v1/models": ("GET", self.models),
                  "/healthz": ("GET", self.health), "/": ("GET", self.page)}
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))  # under the app's route prefix
        route = routes.get(path.rstrip("/") or "/")
        if route is None:
            return _error(404, f"no route {request.url.path}; routes: {', '.join(routes)}")
        method, handler = route
        if request.method != method:
            return _error(405, f"{request.url.path} takes {method}, not {request.method}")
        return await handler(request)

    async def generate(self, request: Request) -> JSONResponse:
        return await self._serve(request, self._parse_generate, generation_response, _error)

    async def images_generations(self, request: Request) -> JSONResponse:
        return await self._serve(request, self._parse_images, images_response, _openai_error)

    def _parse_generate(self, body: bytes, content_type: str | None) -> GenerateRequest:
        return parse_generate(body, content_type, self.served)

    def _parse_images(self, body: bytes, content_type: str | None) -> GenerateRequest:
        return parse_images_request(body, content_type, self.served)

    async def _serve(self, request: Request, parse, answer, error) -> JSONResponse:
        """A generate request of either API: ``parse`` (body, content type) -> :class:`GenerateRequest`,
        ``answer`` (generation) -> the JSON body, ``error`` (status, message, headers, param) -> the refusal."""
        if self.drain.stopping:
            return error(503, "this service is stopping; retry on another instance", {"Retry-After": "1"})
        start = time.perf_counter()
        self.drain.held += 1
        try:
            response = await self._run(request, parse, answer, error)
        finally:
            self.drain.held -= 1
        self.requests.inc(tags={"status": str(response.status_code)})
        if response.status_code == 200:
            self.latency.observe(time.perf_counter() - start)
        return response

    async def _run(self, request: Request, parse, answer, error) -> JSONResponse:
        job = None
        marks = [time.perf_counter()]
        try:
            req = parse(await _body(request, self.max_request_bytes), request.headers.get("content-type"))
            marks.append(time.perf_counter())
            job = self.pipe.submit(req.conditions, req.mode, req.seed, caption_mask=req.caption_mask,
                                   timeout=req.timeout, **req.options)
            await asyncio.wrap_future(job.future)
            gen = job.result()
            marks.append(time.perf_counter())
            if req.decode:  # pixels off the event loop, so other requests keep flowing
                gen.images, gen.decode_seconds = await asyncio.get_running_loop().run_in_executor(
                    None, self.pipe.decode, gen.tokens)
            marks.append(time.perf_counter())
        except asyncio.CancelledError:  # the client went away: free the batch slots now
            if job is not None:
                job.cancel()
            raise
        except ApiError as err:
            return error(err.status, str(err), param=getattr(err, "param", None))
        except OptionsError as err:
            return error(400, str(err), param=err.option)
        except Busy as err:
            return error(503, str(err), {"Retry-After": "1"})
        except RequestTimeout as err:
            return error(504, str(err))
        except VVSError as err:
            return error(500, str(err))
        self.images.inc(len(gen.stats))
        body = answer(gen)
        marks.append(time.perf_counter())
        return JSONResponse(body, headers={"Server-Timing": server_timing(marks)})

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse(self.served.listing())

    async def model(self, request: Request) -> JSONResponse:
        cfg = self.pipe.engines.target
        text = self.served.text_conditional
        return JSONResponse({"model_type": "t2i" if text else "c2i", "num_classes": self.num_classes,
                             "caption_slots": cfg.cls_token_num if text else 0,
                             # caption embeddings are an input of LlamaGen's t2i targets only; others read prompts
                             "caption_dim": getattr(cfg, "caption_dim", 0) if text else 0,
                             "prompts": self.prompts, "class_names": self.class_names,
                             "image_tokens": cfg.num_image_tokens, "backend": self.pipe.engines.backend,
                             "max_images": self.served.max_images, "default_options": self.pipe.options.to_dict(),
                             "modes": self.modes})

    async def page(self, request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def health(self, request: Request) -> JSONResponse:
        if self.drain.stopping:  # so that a load balancer stops routing here
            return JSONResponse({"status": "stopping", **self.pipe.scheduler.status()}, status_code=503,
                                headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok", **self.pipe.scheduler.status()})

    def check_health(self) -> None:
        """Ray's periodic health check: a replica whose decoding has made no progress for ``STALL_LIMIT_S`` while
        it has work is restarted (its requests fail with a 500)."""
        stalled = self.pipe.scheduler.stalled_for()
        if stalled > STALL_LIMIT_S:
            raise VVSError(f"no decoding progress for {stalled:.0f} s")


TIMING_PHASES = ("request", "tokens", "pixels", "encode")  # read + parse, queue + decode, VQ decode, PNG + base64


def server_timing(marks: list[float]) -> str:
    """A ``Server-Timing`` header (milliseconds) from the phase boundaries of one request, so a client can tell
    the replica's time from the network's and the proxy's."""
    return ", ".join(f"{name};dur={1000 * (b - a):.1f}" for name, a, b in zip(TIMING_PHASES, marks, marks[1:]))


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    too_big = ApiError(413, f"request body over {limit} bytes; send fewer images per request")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str, headers: dict | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": _line(message)}, status_code=status, headers=headers)


def _openai_error(status: int, message: str, headers: dict | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, _line(message), param), status_code=status, headers=headers)


def _line(message: str) -> str:
    return message.splitlines()[0] if message else "error"


def start_ray(address: str | None = None, **init) -> None:
    """Join the Ray cluster at ``address``, or start a local instance whose workers run at normal priority: Ray
    starts workers at nice 15 unless told otherwise, and replicas at nice 15 yield the cores to every other process
    on the machine (the clients, other services). A cluster's own setting is left alone, and
    ``RAY_worker_niceness`` in the environment still wins."""
    import ray

    if address is None:
        os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address=address, include_dashboard=False, **init)


def application(engine_dir: str, *, backend: str = "auto", device: str | None = None, threads: int | None = None,
                max_batch: int = 16, max_queue: int = 256, max_images: int = 64, replicas: int = 1,
                autoscaling: dict | None = None, gpus_per_replica: float = 0, cpus_per_replica: float = 1,
                max_ongoing_requests: int | None = None, max_request_bytes: int = MAX_REQUEST_BYTES,
                grace_s: float = 30.0):
    """The bound Ray Serve application. ``autoscaling`` (Ray's ``autoscaling_config``: ``min_replicas``,
    ``max_replicas``, ``target_ongoing_requests``, ...) replaces the fixed ``replicas``. ``threads`` (the backend's
    and torch's, per replica) defaults to the replica's CPU reservation. ``grace_s``: how long a stopping replica
    lets the requests it holds finish."""
    # not Ray's one torch thread: the runtime's own tensor work grows with the batch (16 images: 40 % slower)
    threads = threads or max(1, round(cpus_per_replica))
    deployment = serve.deployment(VVSServer, name="vvs").options(
        num_replicas="auto" if autoscaling else replicas, autoscaling_config=autoscaling,
        ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": cpus_per_replica},
        # a replica takes more requests than it decodes at once, so that they can join its running batches
        max_ongoing_requests=max_ongoing_requests or max(max_batch * 2, 8),
        health_check_period_s=5, health_check_timeout_s=30,
        # on shutdown a replica takes no new requests and waits up to grace_s for the ones it holds
        graceful_shutdown_timeout_s=grace_s, graceful_shutdown_wait_loop_s=0.5)
    return deployment.bind(engine_dir, backend, device, threads, max_batch, max_queue, max_images, max_request_bytes)
