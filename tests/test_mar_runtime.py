"""MAR decoding end to end on small random models: exactness of ``cspd`` against ``ar`` where they must agree,
per-image determinism, the engine folder (ONNX Runtime against torch), the TensorRT-RTX build of every MAR
graph, and the CLIs' MAR paths."""
import json
import subprocess
import sys

import pytest
import torch

from vvs.engines import load_engines
from vvs.families.mar.engines import MAREngineSet, torch_mar_engines
from vvs.engines.manifest import read_manifest
from vvs.errors import VVSError
from vvs.families.mar.exporter import export_mar_folder
from vvs.families.mar.latents import VQLatents
from vvs.families.mar.model import MAR, mar_config
from vvs.models.vq import VQModel, vq_config
from vvs.families.mar.decode import MaskSchedule
from vvs.families.mar.pipeline import MARPipeline
from vvs.families.mar.options import MAROptions
from vvs.runtime.options import OptionsError

SMALL_MAR = dict(img_size=32, vae_stride=8, vae_embed_dim=8, class_num=4, num_sampling_steps="4")
DEFAULTS = {"num_iter": 6, "cfg_scale": 2.0, "draft_steps": 2, "prefill_ratio": 0.2}


def small_mar(seed: int, **overrides) -> MAR:
    torch.manual_seed(seed)
    model = MAR(mar_config("MAR-vvs-XS", **{**SMALL_MAR, **overrides})).eval()
    with torch.no_grad():  # the official init zeroes the head's output; give it structure, with a sane variance
        for p in model.diffloss.net.parameters():
            p.normal_(0, 0.05)
        model.diffloss.net.final_layer.linear.bias[8:] = -0.5
    return model


@pytest.fixture(scope="module")
def models():
    vq = VQModel(vq_config("VQ-tiny", codebook_embed_dim=8, encoder_ch_mult=(1, 2, 2, 2),
                           decoder_ch_mult=(1, 2, 2, 2))).eval()
    return small_mar(0), small_mar(1, encoder_depth=1, decoder_depth=1), VQLatents(vq, 2.0)


@pytest.fixture(scope="module")
def pipe(models):
    target, draft, tok = models
    return MARPipeline(torch_mar_engines(target, draft, tok, 32, default_options=DEFAULTS))


@pytest.fixture(scope="module")
def folder(models, tmp_path_factory):
    path = tmp_path_factory.mktemp("mar") / "engines-mar"
    export_mar_folder(*models, path, 32, DEFAULTS, {"classes": ["a", "b", "c", "d"]}, progress=False)
    return path


def test_schedule_generates_every_token_once():
    for seq_len, num_iter in ((256, 64), (256, 32), (4, 4), (16, 16), (64, 7)):
        schedule = MaskSchedule(seq_len, num_iter)
        spans = [schedule.span(s) for s in range(num_iter)]
        covered = sorted(i for lo, hi in spans for i in range(lo, hi))
        assert covered == list(range(seq_len)), (seq_len, num_iter)
        assert all(hi > lo for lo, hi in spans)  # every step generates something
    # MAR's first step of a 256-token image at 64 steps generates one token; the linear guidance starts near 1
    schedule = MaskSchedule(256, 64)
    assert schedule.span(0) == (255, 256)
    assert schedule.cfg(0, MAROptions(cfg_scale=3.0)) == pytest.approx(1 + 2 * 1 / 256)
    assert schedule.cfg(5, MAROptions(cfg_scale=3.0, cfg_schedule="constant")) == 3.0


@pytest.mark.parametrize("options", [dict(cfg_scale=2.0), dict(cfg_scale=1.0, temperature=0.8)])
def test_cspd_with_the_target_as_draft_is_ar_exactly(models, options):
    """Same model, one draft step per verification: every draft is the target's own token (same noise), all are
    accepted, and the latents equal MAR's sampler bit for bit."""
    target, _, tok = models
    pipe = MARPipeline(torch_mar_engines(target, target, tok, 32, default_options=DEFAULTS))
    ar = pipe.generate([0, 3, 1], mode="ar", seed=5, decode_images=False, **options)
    sp = pipe.generate([0, 3, 1], mode="cspd", seed=5, decode_images=False, draft_steps=1, **options)
    assert torch.equal(ar.tokens, sp.tokens)
    agg = sp.aggregate()
    assert agg["acceptance_rate"] == 1.0 and agg["residual_fallbacks"] == 0


def test_forward_counts(pipe):
    """num_iter 6, prefill 0.2 -> the target runs 2 steps, the draft 4, verified in windows of 2."""
    ar = pipe.generate([0, 1], mode="ar", seed=0, decode_images=False)
    sp = pipe.generate([0, 1], mode="cspd", seed=0, decode_images=False)
    for s in ar.stats:
        assert (s.target_forwards, s.drafter_forwards, s.tokens) == (6, 0, 16)
    for s in sp.stats:
        assert (s.target_forwards, s.prefill_forwards, s.drafter_forwards) == (4, 2, 4)
        assert len(s.verified_lengths) == 2 and sum(s.verified_lengths) + sum(t[2] for t in s.trace
                                                                               if t[0] == "target") == 16
        assert 0 <= sum(s.accept_lengths) <= sum(s.verified_lengths)
    written = json.loads(json.dumps(sp.stats[0].to_dict()))  # as vvs-run writes it
    assert written["target_forwards"] == 4 and written["verified_lengths"] == sp.stats[0].verified_lengths


def test_an_image_does_not_depend_on_its_batch(pipe):
    batch = pipe.generate([2, 0, 3], mode="cspd", seed=[7, 8, 9], decode_images=False)
    alone = pipe.generate([0], mode="cspd", seed=8, decode_images=False)
    torch.testing.assert_close(batch.tokens[1], alone.tokens[0], atol=1e-3, rtol=1e-4)
    assert batch.stats[1].accept_lengths == alone.stats[0].accept_lengths


def test_options_are_checked(pipe):
    with pytest.raises(OptionsError, match="num_iter=17: exceeds the image's 16 tokens"):
        pipe.generate([0], num_iter=17)
    with pytest.raises(OptionsError, match="unknown mode for a MAR model; choose one of ar, cspd"):
        pipe.generate([0], mode="vvs")
    with pytest.raises(OptionsError, match="temperature=0.0: must be > 0"):
        pipe.generate([0], temperature=0.0)
    with pytest.raises(OptionsError, match="accept_rule='tempered': choose one of exact, trajectory, official"):
        pipe.generate([0], accept_rule="tempered")
    with pytest.raises(OptionsError, match="class id 4 is out of range"):
        pipe.generate([4])


def test_draft_must_share_the_targets_tokens(models):
    target, _, tok = models
    with pytest.raises(VVSError, match="num_sampling_steps is 8 for the draft but 4 for the target"):
        torch_mar_engines(target, small_mar(2, num_sampling_steps="8"), tok, 32)


def test_onnxruntime_folder_matches_torch(folder, pipe):
    manifest = read_manifest(folder)
    assert manifest["model"]["family"] == "mar" and set(manifest["graphs"]) == {
        "target_forward", "target_head", "target_head_steps", "draft_forward", "draft_head", "draft_head_steps",
        "latent_decode"}
    engines = load_engines(folder)
    assert isinstance(engines, MAREngineSet) and engines.backend == "onnxruntime"
    ort = MARPipeline(engines)
    for mode, rule in (("ar", "exact"), ("cspd", "exact"), ("cspd", "official"), ("cspd", "trajectory")):
        a = ort.generate([1, 2], mode=mode, seed=3, accept_rule=rule)
        b = pipe.generate([1, 2], mode=mode, seed=3, accept_rule=rule)
        assert [s.accept_lengths for s in a.stats] == [s.accept_lengths for s in b.stats]
        close = torch.isclose(a.tokens, b.tokens, atol=1e-3, rtol=2e-3)
        if rule == "trajectory":
            # a redraw tries target chains against chain densities whose last steps are ~1e-3 wide: rounding can
            # move a try across its acceptance bound and pick another chain, for an occasional token
            assert close.all(-1).float().mean() > 0.95
            continue
        # the random heads amplify rounding through the sampler's steps (latents reach ~50): compare relatively
        torch.testing.assert_close(a.tokens, b.tokens, atol=1e-3, rtol=2e-3)
        torch.testing.assert_close(a.images, b.images, atol=1e-3, rtol=1e-3)
    torch_folder = MARPipeline(load_engines(folder, backend="torch"))
    torch.testing.assert_close(torch_folder.generate([1], seed=4).tokens, pipe.generate([1], seed=4).tokens)


def test_openvino_folder_matches_onnxruntime(folder):
    """The seven graphs on OpenVINO (the unrolled samplers included): ONNX Runtime's acceptances and latents."""
    pipes = [MARPipeline(load_engines(folder, backend=b, threads=1)) for b in ("onnxruntime", "openvino")]
    assert pipes[1].engines.backend == "openvino"
    for mode in ("ar", "cspd"):
        a, b = (p.generate([1, 2], mode=mode, seed=3) for p in pipes)
        assert [s.accept_lengths for s in a.stats] == [s.accept_lengths for s in b.stats]
        torch.testing.assert_close(b.tokens, a.tokens, atol=1e-3, rtol=2e-3)
        torch.testing.assert_close(b.images, a.images, atol=1e-3, rtol=1e-3)


def test_every_mar_graph_builds_in_tensorrt_rtx(folder, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="the test set-up installs tensorrt-rtx-cu13 from PyPI")
    import shutil

    from vvs.engines.tensorrt_build import build_folder

    copy = tmp_path / "eng"
    shutil.copytree(folder, copy)
    manifest = build_folder(copy, "tensorrt-rtx", max_images=2)
    engines = manifest["tensorrt-rtx"]["engines"]
    assert set(engines) == set(manifest["graphs"])
    assert all((copy / e["file"]).stat().st_size > 10_000 for e in engines.values())
    head = engines["target_head"]["profiles"][0]["noise"]
    assert head == [[1, 8], [4, 8], [32, 8]]  # one verification of every token of 2 images at most


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from vvs.cli.run import main; main()", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_vvs_run_on_a_mar_folder(folder, tmp_path):
    out = run_cli("--engine", str(folder), "--mode", "ar,cspd", "--class", "b,d", "--cfg", "1.5", "--out",
                  str(tmp_path / "o"), "--stats-json", str(tmp_path / "s.json"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "o").glob("*.png")) == [
        "ar_000_b.png", "ar_001_d.png", "ar_grid.png", "cspd_000_b.png", "cspd_001_d.png", "cspd_grid.png"]
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["aggregate"]["cspd"]["drafter_forwards"] == 8
    bad = run_cli("--engine", str(folder), "--top-p", "0.5", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "vvs-run: error: option --top-p: applies to LlamaGen, Janus-Pro and Lumina-mGPT engine folders only; this "
        "folder holds a MAR model"]
    bad = run_cli("--engine", str(folder), "--draft-steps", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "option --draft-steps 0: must be >= 1" in bad.stderr
