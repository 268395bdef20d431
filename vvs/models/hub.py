"""Official checkpoints named by their Hugging Face hub id, ``ORG/NAME[@REVISION][/PATH/IN/REPO]``: resolved to a
file or folder of the hub's own cache (downloaded where missing; ``HF_HOME``, ``HF_HUB_CACHE`` and
``HF_HUB_OFFLINE`` apply), with the record of where each came from that the engine folder's manifest keeps.

A value that exists on disk is always a path: an id is looked up only where no such file or folder exists.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import click
import requests
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)

from vvs.errors import VVSError

# the hub's repository names: letters, digits, '-', '_', '.'; a revision (branch, tag, commit) without '/', so
# that the path after it is unambiguous
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                     r"(?:@(?P<revision>[^/@\s]+))?(?:/(?P<path>[^@\s]*))?", re.ASCII)
# weights of other frameworks, which no vvs reader takes: large repositories (FLAN-T5's) carry them beside the
# torch ones, so a folder's download leaves them out
FOREIGN_WEIGHTS = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data", "*.tflite", "*.gguf"]


@dataclass(frozen=True)
class HubId:
    repo: str
    revision: str | None = None
    path: str | None = None  # a file or folder inside the repository; None: the whole repository

    def download_command(self, file: bool) -> str:
        """The ``hf`` command that puts it into the cache (``file``: the path is known to be a file; else a path
        without a suffix is taken for a folder)."""
        where = "" if self.path is None else f" {self.path}"
        if self.path is not None and not file and not PurePosixPath(self.path).suffix:
            where = f" --include '{self.path}/*'"
        return f"hf download {self.repo}{where}" + (f" --revision {self.revision}" if self.revision else "")


def parse_hub_id(value: str) -> HubId | None:
    """The hub id ``value`` spells, or None if it is not one."""
    match = _HUB_ID.fullmatch(value)
    if match is None:
        return None
    path = (match["path"] or "").strip("/") or None
    if path is not None and any(part in ("", ".", "..") for part in path.split("/")):
        return None
    return HubId(match["repo"], match["revision"], path)


def resolve_options(options: dict, params, echo=None) -> tuple[dict, dict]:
    """``options`` with every path option (``click.Path`` among ``params``) that names a hub id instead of an
    existing path replaced by the local file or folder; and, per option name, where each came from (repo, the
    revision asked for, the commit, the path in the repository) for the manifest's ``sources``."""
    types = {p.name: p for p in params if isinstance(p.type, click.Path)}
    resolved, sources = dict(options), {}
    for name, value in options.items():
        if name not in types or not isinstance(value, str) or Path(value).exists():
            continue
        hub_id = parse_hub_id(value)
        if hub_id is None:
            continue
        param = types[name]
        local, sources[name] = fetch(hub_id, f"{param.opts[0]} {value}", file_only=not param.type.dir_okay)
        resolved[name] = str(local)
        if echo is not None:
            echo(f"{param.opts[0]} {value}: commit {sources[name]['commit'][:12]}, {local}")
    return resolved, sources


def fetch(hub_id: HubId, what: str, file_only: bool = False) -> tuple[Path, dict]:
    """The local file or folder of ``hub_id`` in the hub's cache, downloaded where missing, and its record.
    ``what`` starts every error message (``--checkpoint ORG/NAME``): one line saying what to download and where."""
    if file_only and hub_id.path is None:
        raise VVSError(f"{what}: names a whole Hugging Face repository, and this option takes a file; add the "
                       f"file's path in it, e.g. {hub_id.repo}/<file>")
    revision = hub_id.revision or "main"
    files, unreachable = _listing(hub_id, what, revision)
    try:
        if files is None:  # offline or unreachable: the cache's snapshot of the revision, if it has one
            local = Path(snapshot_download(hub_id.repo, revision=revision, local_files_only=True))
            local = local / hub_id.path if hub_id.path else local
            if not local.exists():
                raise LocalEntryNotFoundError(str(local))
        elif hub_id.path in files:
            local = Path(hf_hub_download(hub_id.repo, hub_id.path, revision=revision))
        elif hub_id.path is None or any(f.startswith(hub_id.path + "/") for f in files):
            local = Path(snapshot_download(hub_id.repo, revision=revision,
                                           ignore_patterns=FOREIGN_WEIGHTS + _pickled_twins(files),
                                           allow_patterns=None if hub_id.path is None else f"{hub_id.path}/*"))
            local = local / hub_id.path if hub_id.path else local
        else:
            raise VVSError(f"{what}: {hub_id.repo} has no file or folder {hub_id.path} at revision {revision}; see "
                           f"https://huggingface.co/{hub_id.repo}/tree/{revision}")
    except LocalEntryNotFoundError:
        cache = Path(constants.HF_HUB_CACHE)
        home = f"HF_HOME={constants.HF_HOME}" if cache == Path(constants.HF_HOME) / "hub" else f"HF_HUB_CACHE={cache}"
        raise VVSError(f"{what}: no such local path, and not in the Hugging Face cache at {cache} while "
                       f"{unreachable or 'the hub cannot be reached'}: on a connected machine run "
                       f"'{hub_id.download_command(file_only)}' ({home}), or give a local "
                       f"{'file' if file_only else 'path'}") from None
    except (OSError, requests.RequestException) as err:
        raise VVSError(f"{what}: the download from the Hugging Face hub failed ({_first_line(err)}); run the "
                       "command again, or give a local path") from None
    depth = len(PurePosixPath(hub_id.path).parts) if hub_id.path else 0
    snapshot = local.parents[depth - 1] if depth else local  # <cache>/models--ORG--NAME/snapshots/<commit>
    record = {"repo": hub_id.repo, "revision": revision, "commit": snapshot.name}
    if hub_id.path:
        record["path"] = hub_id.path
    return local, record


def _listing(hub_id: HubId, what: str, revision: str) -> tuple[list[str] | None, str | None]:
    """The repository's files at ``revision``, or None and why the hub was not asked or did not answer. One
    request bounded by ``HF_HUB_ETAG_TIMEOUT`` and not retried: huggingface_hub's downloads retry five times with
    back-off (23 s where the name does not resolve, over a minute where the network drops packets), so an
    unreachable hub is found out here and the downloads then ask only the cache."""
    if constants.HF_HUB_OFFLINE:
        return None, "HF_HUB_OFFLINE is set"
    try:
        info = HfApi().repo_info(hub_id.repo, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except GatedRepoError:
        raise VVSError(f"{what}: a gated repository; accept its conditions at https://huggingface.co/{hub_id.repo} "
                       "and log in with 'hf auth login', or give a local path") from None
    except RepositoryNotFoundError:
        raise VVSError(f"{what}: no such local path, nor repository on the Hugging Face hub (a private one needs "
                       "'hf auth login'); check the name") from None
    except RevisionNotFoundError:
        raise VVSError(f"{what}: {hub_id.repo} has no revision {revision}; see "
                       f"https://huggingface.co/{hub_id.repo}/commits/main") from None
    except requests.Timeout:
        return None, f"the hub did not answer within {constants.HF_HUB_ETAG_TIMEOUT} s (HF_HUB_ETAG_TIMEOUT)"
    except requests.HTTPError as err:
        return None, f"the hub answered HTTP {err.response.status_code if err.response is not None else '?'}"
    except requests.RequestException:
        return None, "the hub cannot be reached"
    return [f.rfilename for f in info.siblings or ()], None


def _pickled_twins(files: list[str]) -> list[str]:
    """The ``pytorch_model*.bin`` files beside safetensors in their folder: the same weights pickled, which every
    vvs reader (and transformers) reads only where there are no safetensors."""
    with_safetensors = {PurePosixPath(f).parent for f in files if f.endswith(".safetensors")}
    return [f for f in files if PurePosixPath(f).parent in with_safetensors
            and fnmatch(PurePosixPath(f).name, "pytorch_model*.bin")]


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def folder_name(path) -> str:
    """The name a folder goes by: its own, or, for a snapshot in the hub's cache, its repository's
    (``models--Alpha-VLLM--Lumina-mGPT-7B-768/snapshots/<commit>`` -> ``Lumina-mGPT-7B-768``), which official
    folders' names carry facts in (the resolution)."""
    path = Path(path).resolve()
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--") and repo.count("--") == 2:
        return repo.rsplit("--", 1)[1]
    return path.name
