"""Official checkpoints by Hugging Face hub id (``ORG/NAME[@REVISION][/PATH]``), offline: a hub cache this file
writes in the hub's own layout (``models--ORG--NAME/blobs``, ``snapshots/<commit>/...``, ``refs/<name>``) holds
small official-format checkpoints; ids resolve into it, the manifest records where each came from, and ids that
cannot be resolved are one-line errors."""
from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch
from huggingface_hub import constants, file_download

from tests.conftest import run_cli
from vvs.cli.export import export_cmd, main as export_main
from vvs.errors import VVSError
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.models.hub import HubId, parse_hub_id, resolve_options
from vvs.models.vq import VQModel, vq_config

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
LLAMAGEN = "FoundationVision/LlamaGen"


def put_in_cache(cache: Path, repo: str, commit: str, files: dict[str, Path], refs: tuple[str, ...] = ()) -> Path:
    """``files`` (path in the repository -> local file) as the snapshot ``commit`` of ``repo``, blobs and
    relative links as huggingface_hub writes them; ``refs`` name that commit. Returns the snapshot folder."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    for name, source in files.items():
        data = Path(source).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


def folder_files(folder: Path, prefix: str = "") -> dict[str, Path]:
    return {prefix + p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def llamagen_files(tmp_path_factory):
    """Two official LlamaGen GPT-tiny checkpoints (train-script layout) and a VQ-tiny of the same codebook."""
    root = tmp_path_factory.mktemp("llamagen-official")
    paths = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = GPT(gpt_config("GPT-tiny"))
        paths[seed] = root / f"c2i_tiny_{seed}.pt"
        torch.save({"model": model.state_dict(), "args": argparse.Namespace(gpt_model="GPT-tiny")}, paths[seed])
    vq = VQModel(vq_config("VQ-tiny", codebook_size=model.config.vocab_size))
    paths["vq"] = root / "vq_tiny.pt"
    torch.save({"model": vq.state_dict()}, paths["vq"])
    return paths


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, llamagen_files):
    """An offline hub cache at ``$HF_HOME/hub`` holding LlamaGen's repository at two commits: ``main`` -> A
    (seed 0's target), ``v2`` -> B (seed 1's); both hold the VQ."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    for commit, seed, refs in ((COMMIT_A, 0, ("main",)), (COMMIT_B, 1, ("v2",))):
        put_in_cache(cache, LLAMAGEN, commit, {"c2i_tiny.pt": llamagen_files[seed],
                                               "tokenizer/vq_tiny.pt": llamagen_files["vq"]}, refs)
    # huggingface_hub reads its environment once, at import: the in-process commands see these
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def resolve(**options):
    return resolve_options(options, export_cmd.params)


def test_hub_ids_are_parsed_and_paths_are_not():
    assert parse_hub_id("deepseek-ai/Janus-Pro-1B") == HubId("deepseek-ai/Janus-Pro-1B")
    assert parse_hub_id("FoundationVision/LlamaGen/c2i_B_256.pt") == HubId(LLAMAGEN, None, "c2i_B_256.pt")
    assert parse_hub_id("Alpha-VLLM/Lumina-mGPT@v1.0/ckpts/chameleon/tokenizer/") == HubId(
        "Alpha-VLLM/Lumina-mGPT", "v1.0", "ckpts/chameleon/tokenizer")
    for path in ("/abs/model.pt", "./org/name", "../org/name", "model.pt", "org/name/../../x", "org/name@",
                 "org/-name", "~/org/name"):
        assert parse_hub_id(path) is None, path


def test_an_id_resolves_to_its_file_in_the_cache_and_is_recorded(hub_cache):
    options, sources = resolve(checkpoint=f"{LLAMAGEN}/c2i_tiny.pt", vq=f"{LLAMAGEN}/tokenizer/vq_tiny.pt",
                               config="GPT-tiny", drafter=None)
    snapshot = hub_cache / f"models--{LLAMAGEN.replace('/', '--')}" / "snapshots" / COMMIT_A
    assert options == {"checkpoint": str(snapshot / "c2i_tiny.pt"), "vq": str(snapshot / "tokenizer/vq_tiny.pt"),
                       "config": "GPT-tiny", "drafter": None}
    assert sources == {"checkpoint": {"repo": LLAMAGEN, "revision": "main", "commit": COMMIT_A, "path": "c2i_tiny.pt"},
                       "vq": {"repo": LLAMAGEN, "revision": "main", "commit": COMMIT_A,
                              "path": "tokenizer/vq_tiny.pt"}}
    # a folder in the repository, and the whole repository, for an option that takes folders
    options, sources = resolve(drafter=f"{LLAMAGEN}/tokenizer", checkpoint=LLAMAGEN)
    assert options == {"drafter": str(snapshot / "tokenizer"), "checkpoint": str(snapshot)}
    assert sources["checkpoint"] == {"repo": LLAMAGEN, "revision": "main", "commit": COMMIT_A}


def test_a_revision_picks_its_snapshot(hub_cache, llamagen_files):
    for revision, commit, seed in (("v2", COMMIT_B, 1), (COMMIT_B, COMMIT_B, 1), ("main", COMMIT_A, 0),
                                   (COMMIT_A, COMMIT_A, 0)):
        options, sources = resolve(checkpoint=f"{LLAMAGEN}@{revision}/c2i_tiny.pt")
        assert Path(options["checkpoint"]).read_bytes() == llamagen_files[seed].read_bytes(), revision
        assert sources["checkpoint"] == {"repo": LLAMAGEN, "revision": revision, "commit": commit,
                                         "path": "c2i_tiny.pt"}


def test_a_local_path_that_looks_like_an_id_wins(hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "FoundationVision" / "LlamaGen" / "c2i_tiny.pt"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"mine")
    for value in ("FoundationVision/LlamaGen/c2i_tiny.pt", "FoundationVision/LlamaGen"):
        assert resolve(checkpoint=value) == ({"checkpoint": value}, {})
    # options that name no path are never looked up, whatever they hold
    assert resolve(config=f"{LLAMAGEN}/c2i_tiny.pt") == ({"config": f"{LLAMAGEN}/c2i_tiny.pt"}, {})


def test_the_snapshots_of_official_folders_go_by_their_repositorys_name(lumina_official, hub_cache):
    """Lumina-mGPT's resolution is in its folder's name (Lumina-mGPT-7B-768), which a snapshot folder (named by its
    commit) does not carry; a whole repository and a folder inside one load as the local folders do."""
    from tests.lumina_reference import GRID, SLOTS
    from vvs.families.lumina_mgpt.bundle import load_bundle
    from vvs.families.lumina_mgpt.loading import grid_of

    folder, tokenizer_dir, _ = lumina_official
    put_in_cache(hub_cache, "Alpha-VLLM/Lumina-mGPT-7B-768", COMMIT_A, folder_files(folder), ("main",))
    put_in_cache(hub_cache, "Alpha-VLLM/Lumina-mGPT", COMMIT_B,
                 folder_files(tokenizer_dir, "lumina_mgpt/ckpts/chameleon/tokenizer/"), ("main",))
    options, sources = resolve(checkpoint="Alpha-VLLM/Lumina-mGPT-7B-768",
                               tokenizer_dir="Alpha-VLLM/Lumina-mGPT/lumina_mgpt/ckpts/chameleon/tokenizer")
    assert grid_of(Path(options["checkpoint"])) == 48
    assert sources["tokenizer_dir"]["commit"] == COMMIT_B
    ours = load_bundle(options["checkpoint"], options["tokenizer_dir"], prompt_tokens=SLOTS, resolution=GRID * 16)
    local = load_bundle(str(folder), str(tokenizer_dir), prompt_tokens=SLOTS, resolution=GRID * 16)
    for got, expected in ((ours.target, local.target), (ours.vq, local.vq)):
        state = expected.state_dict()
        assert all(torch.equal(v, state[k]) for k, v in got.state_dict().items())


@pytest.mark.parametrize("value, option, message", [
    ("deepseek-ai/Janus-Pro-1B", "--checkpoint",
     "--checkpoint deepseek-ai/Janus-Pro-1B: no such local path, and not in the Hugging Face cache at {cache} while "
     "HF_HUB_OFFLINE is set: on a connected machine run 'hf download deepseek-ai/Janus-Pro-1B' (HF_HOME={home}), or "
     "give a local path"),
    (f"{LLAMAGEN}@v3/c2i_B_256.pt", "--checkpoint", f"run 'hf download {LLAMAGEN} c2i_B_256.pt --revision v3'"),
    (f"{LLAMAGEN}/vq_ds16_c2i.pt", "--vq", f"not in the Hugging Face cache at {{cache}} while HF_HUB_OFFLINE is "
                                          f"set: on a connected machine run 'hf download {LLAMAGEN} vq_ds16_c2i.pt'"),
    (LLAMAGEN, "--vq", f"--vq {LLAMAGEN}: names a whole Hugging Face repository, and this option takes a file; add "
                       f"the file's path in it, e.g. {LLAMAGEN}/<file>"),
])
def test_an_id_that_cannot_be_resolved_is_one_line_and_leaves_nothing(hub_cache, tmp_path, capsys, monkeypatch,
                                                                     value, option, message):
    out = tmp_path / "engines"
    code, _, err = run_cli(export_main, [option, value, "--config", "GPT-tiny", "--out", out], capsys, monkeypatch)
    message = message.format(cache=hub_cache, home=hub_cache.parent)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".engines")]


@pytest.mark.slow
def test_the_command_reads_the_hubs_environment(tmp_path):
    """HF_HOME and HF_HUB_OFFLINE as a user sets them, in a process of its own: one line, exit 2, no traceback."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", "from vvs.cli.export import main; main()", "--model", "janus-pro",
                           "--checkpoint", "deepseek-ai/Janus-Pro-1B", "--out", str(tmp_path / "engines")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"not in the Hugging Face cache at {tmp_path / 'home' / 'hub'}" in \
        proc.stderr and f"(HF_HOME={tmp_path / 'home'})" in proc.stderr, proc.stderr
    assert not (tmp_path / "engines").exists()


def test_a_hub_that_does_not_answer_costs_the_etag_timeout_then_the_cache_answers(hub_cache, monkeypatch):
    """Online, the hub is asked once, bounded by HF_HUB_ETAG_TIMEOUT and not retried (huggingface_hub's
    downloads retry for over 20 s); then the cache answers what it holds, and what it lacks is one line."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    try:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
        start = time.monotonic()
        options, sources = resolve(checkpoint=f"{LLAMAGEN}@v2/c2i_tiny.pt")
        assert sources["checkpoint"]["commit"] == COMMIT_B
        with pytest.raises(VVSError, match=r"while the hub did not answer within 1 s \(HF_HUB_ETAG_TIMEOUT\): on a "
                                           "connected machine run 'hf download deepseek-ai/Janus-Pro-1B'"):
            resolve(checkpoint="deepseek-ai/Janus-Pro-1B")
        assert time.monotonic() - start < 6
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # refused: at once
        start = time.monotonic()
        with pytest.raises(VVSError, match="while the hub cannot be reached"):
            resolve(checkpoint="deepseek-ai/Janus-Pro-1B")
        assert time.monotonic() - start < 3
    finally:
        listener.close()


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The two routes huggingface_hub's downloads use, answered as the hub answers them: a repository's listing at
    a revision (``/api/models/ORG/NAME/revision/REV``) and a file (``/ORG/NAME/resolve/REV/PATH``, HEAD and GET),
    for ``repos``: repo -> revision or commit -> (commit, {path: bytes})."""
    repos: dict = {}

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(body=False)

    def do_GET(self):
        self.answer(body=True)

    def answer(self, body: bool):
        parts = unquote(urlsplit(self.path).path).strip("/").split("/")
        listing = parts[:2] == ["api", "models"]
        if listing:
            parts = parts[2:]
        repo, rest = "/".join(parts[:2]), parts[2:]
        if repo not in self.repos:
            return self.fail(404, "RepoNotFound")
        if len(rest) < 2 or rest[0] not in ("revision", "resolve") or rest[1] not in self.repos[repo]:
            return self.fail(404, "RevisionNotFound")
        commit, files = self.repos[repo][rest[1]]
        if listing:
            data = json.dumps({"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]}).encode()
            headers = {"Content-Type": "application/json"}
        else:
            path = "/".join(rest[2:])
            if path not in files:
                return self.fail(404, "EntryNotFound")
            data = files[path]
            headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def fail(self, status: int, code: str):
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_online_a_file_downloads_alone_a_folder_or_repository_as_a_snapshot(hub_cache, llamagen_files, monkeypatch):
    """A connected machine (a local stand-in of the hub): the listing decides between a file (hf_hub_download), a
    folder and the whole repository (snapshot_download, other frameworks' weights left out); the cache then
    answers offline; a missing repository, revision or file is one line."""
    commit = "c" * 40
    files = {"c2i_tiny.pt": llamagen_files[1].read_bytes(), "tokenizer/vq_tiny.pt": llamagen_files["vq"].read_bytes(),
             "flax_model.msgpack": b"not for torch", "text/model.safetensors": b"weights",
             "text/pytorch_model.bin": b"the same weights, pickled", "drafter/pytorch_model.bin": b"the only ones"}
    FakeHub.repos = {LLAMAGEN: {"main": (commit, files), commit: (commit, files)}}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE",
                            endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        snapshot = hub_cache / f"models--{LLAMAGEN.replace('/', '--')}" / "snapshots" / commit
        options, sources = resolve(checkpoint=f"{LLAMAGEN}/c2i_tiny.pt")  # main moved on from the cached A
        assert options["checkpoint"] == str(snapshot / "c2i_tiny.pt") and sorted(os.listdir(snapshot)) == [
            "c2i_tiny.pt"]
        assert sources["checkpoint"] == {"repo": LLAMAGEN, "revision": "main", "commit": commit, "path": "c2i_tiny.pt"}
        options, _ = resolve(drafter=f"{LLAMAGEN}/tokenizer")
        assert Path(options["drafter"], "vq_tiny.pt").read_bytes() == files["tokenizer/vq_tiny.pt"]
        options, sources = resolve(checkpoint=f"{LLAMAGEN}@{commit}")
        assert options["checkpoint"] == str(snapshot)
        assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == [
            "c2i_tiny.pt", "drafter/pytorch_model.bin", "text/model.safetensors", "tokenizer/vq_tiny.pt"]
        assert sources["checkpoint"] == {"repo": LLAMAGEN, "revision": commit, "commit": commit}
        for value, message in ((f"{LLAMAGEN}/c2i_XL_384.pt", f"{LLAMAGEN} has no file or folder c2i_XL_384.pt at "
                                                             "revision main"),
                               (f"{LLAMAGEN}@v9/c2i_tiny.pt", f"{LLAMAGEN} has no revision v9"),
                               ("FoundationVision/LlamaGen-2", "no such local path, nor repository on the Hugging "
                                                               "Face hub")):
            with pytest.raises(VVSError, match=message):
                resolve(checkpoint=value)
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve(checkpoint=f"{LLAMAGEN}/c2i_tiny.pt")[1]["checkpoint"]["commit"] == commit


@pytest.mark.slow
def test_export_by_hub_id_records_the_source_and_exports_the_snapshots_weights(hub_cache, llamagen_files, tmp_path,
                                                                                capsys, monkeypatch):
    from vvs.discrete.folder_models import folder_target
    from vvs.engines.manifest import EngineFolderError, read_manifest, update_manifest
    from vvs.families.llamagen.loading import load_gpt

    out = tmp_path / "engines"
    code, stdout, err = run_cli(export_main, ["--checkpoint", f"{LLAMAGEN}@v2/c2i_tiny.pt", "--config", "GPT-tiny",
                                              "--vq", f"{LLAMAGEN}/tokenizer/vq_tiny.pt", "--vq-config", "VQ-tiny",
                                              "--out", out], capsys, monkeypatch)
    assert code == 0, err
    assert f"--checkpoint {LLAMAGEN}@v2/c2i_tiny.pt: commit {COMMIT_B[:12]}" in stdout
    manifest = read_manifest(out)  # the schema takes the record
    assert manifest["sources"] == {
        "checkpoint": {"repo": LLAMAGEN, "revision": "v2", "commit": COMMIT_B, "path": "c2i_tiny.pt"},
        "vq": {"repo": LLAMAGEN, "revision": "main", "commit": COMMIT_A, "path": "tokenizer/vq_tiny.pt"}}
    # the weights are the revision's, as an export of the local file has them
    expected = load_gpt(llamagen_files[1], gpt_config("GPT-tiny")).state_dict()
    exported = folder_target(out, manifest).state_dict()  # read back from the graphs
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)
    with pytest.raises(EngineFolderError, match="sources.checkpoint.commit"):
        update_manifest(out, sources={"checkpoint": {"repo": LLAMAGEN, "revision": "main", "commit": "HEAD"}})
    assert json.loads((out / "manifest.json").read_text())["sources"] == manifest["sources"]
