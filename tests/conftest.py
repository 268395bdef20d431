"""Shared fixtures: small random LlamaGen models with a drafter briefly trained on the target's own samples."""
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from filelock import FileLock

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.engines import torch_engines
from vvs.discrete.train_drafter import train_drafter
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.models.vq import VQModel, vq_config
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

TINY_CLASSES = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead", "electric ray", "stingray",
                "cock", "hen", "ostrich"]  # the tiny c2i folder's class names (ImageNet's first ten)
SMALL = dict(tree_size=12, depth=3, draft_top_k=4, top_k=0, lantern_k=4, skip_warmup_tokens=3)


# The suite runs on two pytest-xdist workers on two cores (pyproject's addopts): one torch thread each, so that two
# compute-bound tests do not oversubscribe the cores (a test that needs a thread count sets its own)
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def small_bundle(tmp: Path, vocab=16, grid=4, seed=0, model_type="c2i") -> ModelBundle:
    torch.manual_seed(seed)
    extra = dict(model_type="t2i", cls_token_num=3, caption_dim=8) if model_type == "t2i" else {}
    target = GPT(gpt_config("GPT-tiny", vocab_size=vocab, grid_size=grid, **extra)).eval()
    with torch.no_grad():  # sharper distributions than the 0.02 init gives, so sampling has structure
        target.output.weight.mul_(40)
    vq = VQModel(vq_config("VQ-tiny", codebook_size=vocab, decoder_padding="reflect")).eval()  # as the shipped one
    # teach the drafter the target's own samples for a few steps, so that drafts get accepted
    gen = torch.Generator().manual_seed(seed)
    n = 48
    if model_type == "c2i":
        conditions = torch.randint(0, target.config.num_classes, (n,), generator=gen)
    else:
        conditions = torch.randn(n, 3, 8, generator=gen)
    tokens = torch.zeros(n, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(grid * grid):
            logits = target.teacher_forced(conditions, tokens).logits[:, -1]
            tokens = torch.cat([tokens, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
    drafter = train_drafter(target, conditions, tokens, tmp, seed, steps=120, batch=16, lr=3e-3)
    return ModelBundle(target, drafter, vq, "llamagen")


_EXPORTS: dict[str, str] = {}  # name -> the code that exports it


def exported_once(tmp_path_factory, name: str, export: Callable[[Path], object]) -> Path:
    """This process's own copy of the folder ``export(path)`` writes, exported once per test session. A folder's
    export costs 35-45 CPU seconds even for the tiny models (about 10 per ONNX graph), and the suite's two xdist
    workers used to export each shared folder once each; now the first worker to ask exports it into the
    session's base temp folder, which both workers share, and a worker that asks meanwhile waits for it. Each gets a
    copy, because decoding writes into a folder (``draft_tree`` graphs of other tree shapes) and the workers must
    not write into one folder at once. ``export`` builds what the folder needs from the models only when it runs,
    so a worker that only reads the folder builds no models either; both workers' seeded models are the same."""
    site = f"{export.__code__.co_filename}:{export.__code__.co_firstlineno}"
    if _EXPORTS.setdefault(name, site) != site:  # two folders under one name would be read as each other
        raise ValueError(f"exported_once: {name!r} names the folders of {_EXPORTS[name]} and {site}")
    mine = tmp_path_factory.mktemp(name) / name
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing to share
        export(mine)
        return mine
    shared = tmp_path_factory.getbasetemp().parent / "exported" / name
    shared.parent.mkdir(exist_ok=True)
    with FileLock(f"{shared}.lock"):
        if not shared.exists():
            work = shared.with_name(f"{name}.partial")  # what an export that failed halfway left is not reused
            shutil.rmtree(work, ignore_errors=True)
            export(work)
            work.rename(shared)
    shutil.copytree(shared, mine)
    return mine


@pytest.fixture(scope="session")
def bundle_factory(tmp_path_factory):
    cache = {}

    def make(**kwargs) -> ModelBundle:
        key = tuple(sorted(kwargs.items()))
        if key not in cache:
            cache[key] = small_bundle(tmp_path_factory.mktemp("drafter"), **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def pipeline_factory(bundle_factory):
    def make(max_batch: int = 16, **kwargs) -> Pipeline:
        return Pipeline(torch_engines(bundle_factory(**kwargs)), DecodeOptions(**SMALL), max_batch=max_batch)

    return make


@pytest.fixture(scope="session")
def tiny_folder(bundle_factory, tmp_path_factory):
    """An engine folder exported from the small random bundle."""
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, "tiny", lambda out: export_folder(
        bundle_factory(), out, decoding_defaults=SMALL, progress=False, extra_model_info={"classes": TINY_CLASSES}))


@pytest.fixture(scope="session")
def tiny_int8_folder(bundle_factory, tmp_path_factory):
    """The small random bundle exported as SmoothQuant W8A8 (+ fp16), calibrated on its own ar samples, with its
    torch weights (the torch backend's int8 target is quantised from them)."""
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, "tiny-w8a8", lambda out: export_folder(
        bundle_factory(), out, precision="int8", decoding_defaults=SMALL, progress=False, torch_weights=True))


def tiny_weights_folder(bundle_factory, tmp_path_factory, weights: str) -> Path:
    """The small random bundle exported with ``--weights weights`` (ONNX Runtime's block-wise ``MatMulNBits``)."""
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, f"tiny-weights-{weights}", lambda path: export_folder(
        bundle_factory(), path, decoding_defaults=SMALL, progress=False, weights=weights))


@pytest.fixture(scope="session")
def tiny_int4_folder(bundle_factory, tmp_path_factory):
    """The int4 one, which tests of several modules read."""
    return tiny_weights_folder(bundle_factory, tmp_path_factory, "int4")


def run_cli(main, args, capsys, monkeypatch):
    """Run a console entry point in-process; returns (exit code, stdout, stderr)."""
    import sys

    monkeypatch.setattr(sys, "argv", ["prog", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as done:
        code = done.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------- text-to-image from prompts

CAPTIONS = ["a photo of a cat", "a red bird on a branch", "two dogs playing in the snow", "a bowl of soup",
            "a mountain lake at sunset", "an old car parked by the road", "a close-up of a sunflower",
            "people walking in the rain", "a plate with pasta and tomatoes", "a cat sleeping on a sofa"]


def t5_folder(path, width: int):
    """A transformers T5 encoder folder (config.json, model.safetensors, tokenizer.json) with random weights."""
    from vvs.train.text_encoder import save_text_encoder, t5_encoder, train_tokenizer

    tokenizer = train_tokenizer(CAPTIONS * 3, vocab_size=96)
    encoder = t5_encoder(len(tokenizer), width, layers=2, heads=2, head_dim=4, ff=16)
    return save_text_encoder(encoder, tokenizer, path)


@pytest.fixture(scope="session")
def t5_dir(tmp_path_factory):
    return t5_folder(tmp_path_factory.mktemp("t5") / "t5", width=8)


@pytest.fixture(scope="session")
def text_folder(bundle_factory, t5_dir, tmp_path_factory):
    """The small t2i engine folder exported with the encoder (3 caption slots, 8 wide)."""
    from vvs.discrete.exporter import export_folder
    from vvs.text.export import load_text_encoder

    return exported_once(tmp_path_factory, "t2i", lambda out: export_folder(
        bundle_factory(model_type="t2i"), out, decoding_defaults=SMALL, progress=False,
        text_encoder=load_text_encoder(t5_dir, 8)))


@pytest.fixture(scope="session")
def janus_bundle(tmp_path_factory):
    """A tiny random Janus-architecture bundle with a briefly trained drafter (:mod:`tests.janus_reference`)."""
    from tests.janus_reference import small_janus_bundle

    return small_janus_bundle(tmp_path_factory.mktemp("janus-drafter"))


JANUS_PROMPTS = ["a red cat", "a big dog at the river", "a tree"]  # within the small Janus bundle's 12 prompt slots


@pytest.fixture(scope="session")
def janus_int8_folder(request, tmp_path_factory):
    """The small Janus bundle exported as SmoothQuant W8A8 (+ fp16), calibrated on its own ar samples."""
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, "engines-janus-int8", lambda out: export_folder(
        request.getfixturevalue("janus_bundle"), out, precision="int8", decoding_defaults=SMALL, progress=False,
        torch_weights=True))  # the torch backend's int8 target is quantised from them


@pytest.fixture(scope="session")
def janus_folder(request, tmp_path_factory):
    """An engine folder exported from the small Janus bundle, with the official sampling defaults."""
    from vvs.discrete.exporter import export_folder
    from vvs.families.janus_pro.family import SAMPLING

    small = {"tree_size": 6, "depth": 2, "draft_top_k": 2, "lantern_k": 4}
    return exported_once(tmp_path_factory, "engines-janus", lambda out: export_folder(
        request.getfixturevalue("janus_bundle"), out, decoding_defaults={**SAMPLING, **small}, progress=False))


@pytest.fixture(scope="session")
def lumina_official(tmp_path_factory):
    """Stand-ins of an official Lumina-mGPT folder and Chameleon's tokenizer folder, and the transformers model the
    folder holds (:mod:`tests.lumina_reference`)."""
    from tests.lumina_reference import hf_chameleon, write_official_folder, write_tokenizer_folder

    root = tmp_path_factory.mktemp("lumina")
    model = hf_chameleon(per_head_norms=False, seed=1)
    folder = write_official_folder(model, root / "Lumina-mGPT-7B-512", lumina_layout=True)
    return folder, write_tokenizer_folder(root / "chameleon-tokenizer"), model


@pytest.fixture(scope="session")
def lumina_bundle(lumina_official):
    """The stand-ins loaded as a bundle at a 4 x 4 grid, with a random drafter of Chameleon layers (its embedding
    table the target's)."""
    from tests.lumina_reference import GRID, SLOTS, random_drafter
    from vvs.families.lumina_mgpt.bundle import load_bundle

    bundle = load_bundle(str(lumina_official[0]), str(lumina_official[1]), prompt_tokens=SLOTS, resolution=GRID * 16)
    return dataclasses.replace(bundle, drafter=random_drafter(bundle.target))


def lumina_export(request, tmp_path_factory, name: str, precision: str) -> Path:
    """The Lumina-mGPT stand-in exported at ``precision`` with a small tree and guidance 3."""
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, name, lambda out: export_folder(
        request.getfixturevalue("lumina_bundle"), out, precision=precision, decoding_defaults=dict(SMALL, cfg_scale=3.0),
        progress=False))


@pytest.fixture(scope="session")
def lumina_int8_folder(request, tmp_path_factory):
    """The Lumina-mGPT stand-in exported with --precision int8 (shared by the TensorRT-RTX build and ORT tests)."""
    return lumina_export(request, tmp_path_factory, "engines-lumina-int8", "int8")


@pytest.fixture(scope="session")
def lumina_folder(request, tmp_path_factory):
    """The Lumina-mGPT stand-in exported in fp32."""
    return lumina_export(request, tmp_path_factory, "engines-lumina", "fp32")


@pytest.fixture(scope="session")
def lumina_fp16_folder(request, tmp_path_factory):
    """The Lumina-mGPT stand-in exported with --precision fp16."""
    return lumina_export(request, tmp_path_factory, "engines-lumina-fp16", "fp16")
