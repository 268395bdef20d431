"""``vvs-serve``: an engine folder over HTTP with Ray Serve."""
from __future__ import annotations

import os
import time
from pathlib import Path

import click

from vvs.cli.common import catch_signals, engine_options, run_command
from vvs.errors import VVSError


@click.command(help="Serve an engine folder over HTTP with Ray Serve: POST /v1/generate (JSON), GET /v1/model, "
                    "GET /healthz. Starts a local Ray instance, or joins a cluster with --address; each replica holds "
                    "a Pipeline that merges concurrent requests into running batches. Needs the serve extra: "
                    "pip install 'vvs[serve]'.")
@engine_options
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="CPU threads per replica, backend and torch (default: --cpus-per-replica).")
@click.option("--replicas", type=click.IntRange(1), default=1, show_default=True, help="Replicas (fixed count).")
@click.option("--min-replicas", type=click.IntRange(0), default=None, help="Autoscale: fewest replicas.")
@click.option("--max-replicas", type=click.IntRange(1), default=None, help="Autoscale: most replicas (turns it on).")
@click.option("--target-ongoing-requests", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Autoscale: requests per replica Ray aims for (default: --max-batch).")
@click.option("--max-batch", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Images a replica decodes together.")
@click.option("--max-queue", type=click.IntRange(1), default=256, show_default=True,
              help="Images a replica lets wait; beyond it requests get 503 (retry).")
@click.option("--max-images", type=click.IntRange(1), default=64, show_default=True,
              help="Images per request; more gets 413.")
@click.option("--max-request-mb", type=click.FloatRange(min=0, min_open=True), default=64, show_default=True,
              help="Request body size limit in MiB; larger bodies get 413.")
@click.option("--grace-s", type=click.FloatRange(min=0), default=30, show_default=True,
              help="On Ctrl-C or SIGTERM, new requests get 503 and in-flight ones have this many seconds to finish "
                   "before the replicas stop.")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0), default=None,
              help="GPUs Ray reserves per replica (default: 1 for a CUDA device or TensorRT backend, else 0).")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0), default=None,
              help="CPUs Ray reserves per replica (default: this machine's cores / --replicas, or 1 when autoscaling).")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP address (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--address", default=None, help="Ray cluster to join (e.g. ray://head:10001 or auto); default: a "
                                                "new local instance.")
def serve_cmd(engine_dir, backend, device, threads, replicas, min_replicas, max_replicas, target_ongoing_requests,
              max_batch, max_queue, max_images, max_request_mb, grace_s, gpus_per_replica, cpus_per_replica, host, port,
              address):
    from vvs.engines import check_device
    from vvs.engines.manifest import read_manifest, verify_files
    from vvs.families.registry import family_of

    check_device(device)
    folder = Path(engine_dir).resolve()  # replicas run in other working directories
    manifest = read_manifest(folder)
    family = family_of(manifest)
    if not family.serve:
        raise VVSError(f"{engine_dir}: holds a {family.label} model; "
                       + family.instead.get("serve", f"vvs-serve does not serve {family.label} folders yet"))
    verify_files(folder, manifest, hashes=False)  # before Ray starts; each replica checks the sha256 as it loads
    check_port_free(host, port)
    if min_replicas is not None and max_replicas is None:
        raise click.UsageError("--min-replicas needs --max-replicas (autoscaling)")
    autoscaling = None
    if max_replicas is not None:
        low = 1 if min_replicas is None else min_replicas
        if low > max_replicas:
            raise click.UsageError(f"--min-replicas {low} is above --max-replicas {max_replicas}")
        autoscaling = {"min_replicas": low, "max_replicas": max_replicas,
                       "target_ongoing_requests": target_ongoing_requests or max_batch}
    if cpus_per_replica is None:
        cpus_per_replica = 1 if autoscaling else max(1, (os.cpu_count() or 1) // replicas)
    if gpus_per_replica is None:
        gpus_per_replica = 1 if backend in ("tensorrt", "tensorrt-rtx") or (device or "").startswith("cuda") else 0
    if address is None and is_loopback(host):
        # a local instance for a loopback service keeps Ray's own services (GCS, raylet, workers, agents) on
        # loopback too; they listen on every interface unless Ray takes the machine for one that cannot join a
        # cluster, which this switch says (read when ray is imported, so set before)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from ray import serve

        from vvs.serve import drain
        from vvs.serve.deployment import application, start_ray
    except ImportError as err:
        raise VVSError(f"vvs-serve needs Ray Serve ({err.name} is missing): pip install 'vvs[serve]'") from None
    start_ray(address, logging_level="WARNING")
    catch_signals()
    drain_state = drain.create()
    try:  # a signal while the replicas load (minutes) stops the service as one while it serves does
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(str(folder), backend=backend, device=device, threads=threads, max_batch=max_batch,
                              max_queue=max_queue, max_images=max_images, replicas=replicas, autoscaling=autoscaling,
                              gpus_per_replica=gpus_per_replica, cpus_per_replica=cpus_per_replica,
                              max_request_bytes=int(max_request_mb * (1 << 20)), grace_s=grace_s), name="vvs")
        click.echo(f"vvs-serve: serving {folder} at http://{host}:{port}/v1/generate (Ctrl-C stops)", err=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo(f"vvs-serve: stopping; new requests get 503, in-flight ones have up to {grace_s:g} s to finish "
                   "(a second Ctrl-C stops at once)", err=True)
        try:
            drain.drain(drain_state, grace_s)
            serve.delete("vvs")
        finally:  # a second signal skips the drain, never the shutdown
            serve.shutdown()
        raise


def is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another server listens on, instead of sharing its traffic."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT does not count
        try:
            probe.bind((host, port))
        except OSError as err:
            raise VVSError(f"option --port {port}: {host}:{port} is not free ({err.strerror or err}; another "
                           "vvs-serve?); choose another --port or stop that server") from None


def main():
    run_command(serve_cmd, "vvs-serve")
