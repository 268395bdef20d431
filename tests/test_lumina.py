"""Lumina-mGPT end to end on stand-ins of the official files (:mod:`tests.lumina_reference`): the prompt, the
guidance null, the image layout and the sampling restriction as the official solver builds them, checked by
decoding greedily against a reference decoder that runs transformers' Chameleon the official way; forced
end-of-line tokens in every mode; batch invariance; the exported folder on ONNX Runtime."""
import dataclasses

import pytest
import torch

from vvs.discrete.engines import torch_engines
from vvs.families.lumina_mgpt.prompts import PromptIds
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

from tests.lumina_reference import BOI, GRID, SLOTS, official_greedy, official_prompt

PROMPTS = ["a photo of a cat on a sofa", "a red bird", "a bowl of soup at night"]


@pytest.fixture(scope="module")
def official(lumina_official):
    return lumina_official


@pytest.fixture(scope="module")
def bundle(lumina_bundle):
    return dataclasses.replace(lumina_bundle, drafter=None)


def joint_ids(bundle, stream: torch.Tensor) -> list[int]:
    return [bundle.target.config.stream_ids[i] for i in stream.tolist()]


def test_the_prompt_is_the_official_item_processors(bundle, official):
    builder = PromptIds.from_file(bundle.tokenizer, bundle.target.config)
    size = bundle.target.config.size_token(GRID)
    for prompt in PROMPTS:
        assert builder.ids(prompt) == official_prompt(prompt, official[1] / "text_tokenizer.json") + [BOI, size, size]


def test_greedy_ar_is_the_official_solvers_image(bundle, official):
    """Prompts of three lengths in one left-padded batch, guidance 3: every image id and every end-of-line id as
    the reference decoder (transformers' model, the official prompt, null, guidance and restriction) gives them."""
    pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", temperature=0.0, cfg_scale=3.0, top_k=0))
    tokens = pipe.generate(PROMPTS, decode_images=False).tokens
    for prompt, row in zip(PROMPTS, tokens):
        want = official_greedy(official[2], official_prompt(prompt, official[1] / "text_tokenizer.json"), 3.0)
        assert joint_ids(bundle, row) == want, prompt
    assert len({tuple(r.tolist()) for r in tokens}) == len(PROMPTS)  # the prompts matter


def test_the_peers_bench_runs_the_official_procedure_on_transformers(bundle, official, monkeypatch):
    """bench/peers.py's transformers side for Lumina-mGPT (``generate`` with its guidance and layout logits
    processors, transformers' image mask lifted) gives the reference decoder's greedy image, which vvs's greedy
    ``ar`` gives too (above): the peers table compares one procedure on two engines."""
    import copy
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("peers", Path(__file__).parents[1] / "bench" / "peers.py")
    peers = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "peers", peers)  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(peers)
    model = copy.deepcopy(official[2])  # the mask is lifted on this copy only
    size = bundle.target.config.size_token(GRID)
    for prompt in PROMPTS[:2]:
        ids = official_prompt(prompt, official[1] / "text_tokenizer.json")
        image = peers.lumina_image(model, torch.tensor([ids + [BOI, size, size]]), GRID,
                                   dict(cfg_scale=3.0, temperature=1.0, top_k=0), greedy=True)
        assert image == official_greedy(official[2], ids, 3.0), prompt


@pytest.fixture(scope="module")
def with_drafter(lumina_bundle):
    return lumina_bundle


MODES = [("ar", {}), ("sd", {}), ("lantern", {}), ("vvs", dict(skip_interval=2, skip_warmup_tokens=0)),
         ("sjd", dict(window=6)), ("sjd-pac", dict(window=9, pac_tree_width=2, pac_tree_depth=3)),
         ("gsd", dict(window=6))]


@pytest.fixture(scope="module")
def pipe(with_drafter):
    return Pipeline(torch_engines(with_drafter), DecodeOptions(**SMALL_TREE, cfg_scale=3.0), max_batch=8)


SMALL_TREE = dict(tree_size=8, depth=2, draft_top_k=3, top_k=0, lantern_k=4)


@pytest.mark.parametrize("mode, options", MODES)
def test_every_row_ends_in_the_end_of_line_token_in_every_mode(pipe, with_drafter, mode, options):
    cfg = with_drafter.target.config
    gen = pipe.generate(PROMPTS, mode=mode, seed=3, temperature=1.0, top_p=0.9, decode_images=False, **options)
    rows = gen.tokens.view(len(PROMPTS), GRID, GRID + 1)
    assert (rows[:, :, -1] == cfg.eol).all()
    assert (rows[:, :, :-1] < cfg.num_codes).all()  # image ids everywhere else
    assert all(s.tokens == GRID * GRID for s in gen.stats)  # forced tokens are not counted
    if mode == "vvs":
        assert sum(s.skipped_verifications for s in gen.stats) > 0


@pytest.mark.parametrize("mode, options", [("sd", {}), ("vvs", MODES[3][1]), ("sjd-pac", MODES[5][1])])
def test_an_image_does_not_depend_on_the_rest_of_its_batch(pipe, mode, options):
    together = pipe.generate(PROMPTS, mode=mode, seed=[5, 6, 7], decode_images=False, **options).tokens
    for i, prompt in enumerate(PROMPTS):
        alone = pipe.generate([prompt], mode=mode, seed=5 + i, decode_images=False, **options).tokens
        assert torch.equal(alone[0], together[i]), prompt


def test_an_exported_folder_decodes_as_the_torch_modules_on_onnxruntime(with_drafter, lumina_folder, tmp_path,
                                                                        capsys, monkeypatch):
    """ONNX Runtime gives the torch modules' tokens; the torch backend opens the folder too; ``vvs-bench`` takes
    prompts for it."""
    from tests.conftest import SMALL, run_cli
    from vvs.cli.bench import main as bench
    from vvs.engines import load_engines

    torch_pipe = Pipeline(torch_engines(with_drafter), DecodeOptions(**SMALL, cfg_scale=3.0))
    for backend in ("onnxruntime", "torch"):
        folder_pipe = Pipeline(load_engines(lumina_folder, backend))
        for mode in ("ar", "sd"):
            want = torch_pipe.generate(PROMPTS[:2], mode=mode, seed=2, temperature=0.0, decode_images=False).tokens
            got = folder_pipe.generate(PROMPTS[:2], mode=mode, seed=2, temperature=0.0, decode_images=False)
            assert torch.equal(got.tokens, want), (backend, mode)
    images = folder_pipe.generate(PROMPTS[:1], mode="ar", seed=2).images
    assert images.shape == (1, 3, GRID * 2, GRID * 2)  # the stand-in VQGAN downsamples by 2
    code, stdout, err = run_cli(bench, ["--engine", lumina_folder, "--prompt", "a red bird", "--mode", "ar,sjd",
                                        "--num-seeds", "1", "--out", tmp_path / "bench"], capsys, monkeypatch)
    assert code == 0 and "sjd" in stdout, err


@pytest.mark.parametrize("rows", [1, 4])
def test_lanterns_lumina_drafter_folder_loads_strictly_as_a_chameleon_layer(bundle, tmp_path, rows):
    """LANTERN's Lumina-mGPT drafter (``cnets_lumina_mgpt.Model``): the target's whole embedding table, ``fc``, and
    one Chameleon decoder layer (its input normalised), its config the target's with one layer; its query/key norms
    hold one row (Lumina-mGPT's layout) or one per head (its Anole drafter's, ``cnets_anole``). vvs keeps the
    table's stream rows and computes what transformers' ``ChameleonDecoderLayer`` computes on the fused input."""
    import json

    from safetensors.torch import save_file
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer

    from vvs.discrete.loading import load_drafter
    from vvs.models.layers import causal_mask
    from vvs.models.loading import CheckpointError

    torch.manual_seed(4)
    cfg = bundle.target.config
    hf_config = ChameleonConfig(vocab_size=cfg.joint_vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_hidden,
                                num_hidden_layers=1, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
                                rms_norm_eps=1e-5, max_position_embeddings=256)
    hf_config._attn_implementation = "eager"
    layer = ChameleonDecoderLayer(hf_config, 0).eval()
    fc = torch.nn.Linear(2 * cfg.dim, cfg.dim)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "_norm." in name and "self_attn" in name:  # `rows` rows, each shared by its heads
                values = torch.randn(rows, cfg.head_dim) * 0.3 + (1.0 if name.endswith("weight") else 0.0)
                p.copy_(values.repeat_interleave(cfg.n_head // rows, 0))
            elif p.dim() >= 2:
                p.normal_(0, 0.1)
    table = bundle.target.model.embed_tokens.weight.detach().clone()
    state = {"embed_tokens.weight": table, "fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()}
    for key, value in layer.state_dict().items():
        shared = "self_attn" in key and "_norm." in key and rows == 1
        state[f"layers.0.{key}"] = (value[:1] if shared else value).clone()
    folder = tmp_path / "lantern-lumina-drafter"
    folder.mkdir()
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({**hf_config.to_dict(), "model_parallel_size": 1}))
    drafter = load_drafter(folder, cfg)
    assert drafter.config.vocab_size == cfg.vocab_size and drafter.config.first_input_norm
    assert drafter.config.qk_norm_groups == rows

    tokens = torch.tensor([[3, 70, cfg.eol, 8000]])
    features = torch.randn(1, 4, cfg.dim)
    positions = torch.arange(cfg.cls_token_num, cfg.cls_token_num + 4)[None]
    with torch.no_grad():
        got = drafter(features, tokens, positions, causal_mask(4)).hidden
        fused = fc(torch.cat([table[bundle.target.stream_ids[tokens]], features], -1))
        additive = torch.full((4, 4), float("-inf")).triu(1)[None, None]
        want = layer(fused, attention_mask=additive, position_ids=positions)
        want = want[0] if isinstance(want, tuple) else want
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()

    del state["layers.0.self_attn.k_norm.bias"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing 1 key\(s\) \(layers.0.self_attn.k_norm.bias\)"):
        load_drafter(folder, cfg)


def test_cli_exports_an_official_folder_and_runs_prompts(official, tmp_path, capsys, monkeypatch):
    """``vvs-export --model lumina-mgpt --checkpoint FOLDER --tokenizer-dir DIR`` (no drafter: the best exact
    drafter-free mode becomes the default), then ``vvs-run --prompt``; bad requests are one-line errors that leave
    nothing behind."""
    from tests.conftest import run_cli
    from vvs.cli.export import main as export
    from vvs.cli.run import main as run

    folder, tokenizer_dir, _ = official
    out = tmp_path / "engines-lumina"
    base = ["--model", "lumina-mgpt", "--checkpoint", folder, "--out", out]
    for args, message in ((["--tokenizer-dir", tokenizer_dir], "options --tokenizer-dir and --resolution go with "
                                                               "--checkpoint"),
                          (base[2:4], "needs --tokenizer-dir: Chameleon's tokenizer folder"),
                          ([*base[2:4], "--tokenizer-dir", tokenizer_dir, "--resolution", "100"],
                           "option --resolution 100: Lumina-mGPT paints sides that are multiples of 32 pixels"),
                          ([*base[2:4], "--tokenizer-dir", tmp_path], "no such file")):
        code, _, err = run_cli(export, ["--model", "lumina-mgpt", "--out", out, *args], capsys, monkeypatch)
        assert code == 2 and message in err and err.strip().count("\n") == 0, err
        assert not out.exists()
    code, stdout, err = run_cli(export, [*base, "--tokenizer-dir", tokenizer_dir, "--resolution", str(GRID * 16),
                                         "--prompt-tokens", str(SLOTS)], capsys, monkeypatch)
    assert code == 0, err
    code, stdout, err = run_cli(run, ["--engine", out, "--prompt", "a red bird", "--out", tmp_path / "images"],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "sjd-pac" in stdout and (tmp_path / "images" / "sjd-pac_000_a-red-bird.png").is_file()
    code, _, err = run_cli(run, ["--engine", out, "--prompt", " ".join(["cat"] * 20), "--out", tmp_path / "x"],
                           capsys, monkeypatch)
    assert code == 2 and "with the instruction template and the image's start and size tokens; this folder takes " \
                         f"at most {SLOTS}" in err, err


def test_the_int8_folder_keeps_the_layout_on_onnxruntime(lumina_int8_folder):
    """SmoothQuant W8A8 of Chameleon's blocks (calibrated on the target's own guided samples of varied prompts, each
    null row masked as the runtime masks it) in an fp16 folder: the layout and the image ids stay where they are."""
    from vvs.engines import load_engines

    pipe = Pipeline(load_engines(lumina_int8_folder, "onnxruntime"))
    for mode in ("ar", "vvs"):
        rows = pipe.generate(PROMPTS, mode=mode, seed=1, decode_images=False).tokens.view(len(PROMPTS), GRID, GRID + 1)
        assert (rows[..., -1] == pipe.engines.target.eol).all() and (rows[..., :-1] < 8192).all(), mode


def test_vvs_train_lumina_drafter_on_an_official_folder(official, bundle, tmp_path, capsys, monkeypatch):
    """``vvs-train lumina-drafter``: the images' VQGAN codes and captions in, a drafter of Chameleon layers out that
    the folder's target loads; codes outside the codebook are a one-line error."""
    import numpy as np

    from tests.conftest import run_cli
    from vvs.cli.train import main as train
    from vvs.discrete.loading import load_drafter

    folder, tokenizer_dir, _ = official
    data = tmp_path / "codes.npz"
    codes = torch.randint(0, 8192, (6, GRID * GRID), generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(data, codes=codes, prompts=np.array(["a red cat", "a photo of a dog", "a bowl of soup"] * 2))
    args = ["lumina-drafter", "--checkpoint", folder, "--tokenizer-dir", tokenizer_dir, "--data", data,
            "--out", tmp_path / "d", "--steps", "3", "--batch", "2"]
    code, stdout, err = run_cli(train, args, capsys, monkeypatch)
    assert code == 0, err
    drafter = load_drafter(tmp_path / "d" / "drafter.safetensors", bundle.target.config)
    assert drafter.config.qk_norm_groups == 1 and drafter.config.first_input_norm
    np.savez(data, codes=codes + 8192, prompts=np.array(["a red cat"] * 6))
    code, _, err = run_cli(train, args, capsys, monkeypatch)
    assert code == 2 and "codes must lie in [0, 8192)" in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("mode, options", [("sd", {}), ("vvs", MODES[3][1]), ("sjd-pac", MODES[5][1])])
def test_images_that_join_and_leave_a_running_batch_keep_their_tokens(pipe, mode, options):
    """Continuous batching with prompts of three lengths: a batch runs three cycles, a second one joins it, an image
    leaves two cycles later; the images that stay end as they do alone. Each guidance null attends only its own
    three slots, so the cache's per-row blocking must travel with its row through both merges."""
    from vvs.runtime.decode import Decoding
    from vvs.runtime.loops import run, start

    opts = pipe.options_for(mode, temperature=1.0, top_p=0.8, cfg_scale=3.0, **options)
    ids, slots = pipe.engines.conditioning.prepare(pipe.engines, PROMPTS, None)

    def part(images, seeds):
        return start(Decoding(pipe.engines, ids[images], opts, seeds, slots[images]))

    first = part([0, 1], [7, 8])
    for _ in range(3):
        first.step()
    joined = type(first).combine([(first, torch.arange(2)), (part([2], [20]), torch.arange(1))])
    for _ in range(2):
        joined.step()
    staying = type(joined).combine([(joined, torch.tensor([1, 2]))])
    tokens, _ = run(staying)
    pipe.engines.release(staying.d.leases)
    for row, (image, seed) in enumerate([(1, 8), (2, 20)]):
        alone = part([image], [seed])
        want, _ = run(alone)
        pipe.engines.release(alone.d.leases)
        assert torch.equal(tokens[row], want[0]), PROMPTS[image]


def test_the_fp16_verify_graph_is_within_half_precision_error(with_drafter, tmp_path):
    """fp16 weights and activations (RMSNorm, RoPE, the query/key LayerNorms' statistics and the logits as the
    fp16 export keeps them): the stream logits within 5e-2 of fp32 on ONNX Runtime, as for LlamaGen's target."""
    import copy

    import numpy as np
    import onnxruntime as ort

    from vvs.discrete.graphs import build_graphs, graph_specs
    from vvs.export.onnx_export import export_graph
    from vvs.export.spec import sample_inputs
    from vvs.models.layers import cast_floating

    cfg, tree = with_drafter.target.config, DecodeOptions(**SMALL_TREE).tree
    half = copy.deepcopy(with_drafter)
    graph = cast_floating(build_graphs(half.target, half.drafter, half.vq, tree)["target_verify"], torch.float16)
    spec = graph_specs(cfg, half.drafter.config, half.vq.config, tree, "float16")["target_verify"]
    export_graph(graph, spec, tmp_path / "verify16.onnx", cfg.vocab_size, cfg.max_positions - 1)
    session = ort.InferenceSession(str(tmp_path / "verify16.onnx"), providers=["CPUExecutionProvider"])
    inputs = sample_inputs(spec, cfg.vocab_size, cfg.max_positions - 1, dict(batch=2, images=1, new=3, past=40))
    got = session.run(None, {n: t.numpy() for n, t in spec.graph_feeds(dict(zip(spec.input_names, inputs))).items()})
    full = build_graphs(with_drafter.target, with_drafter.drafter, with_drafter.vq, tree)["target_verify"]
    with torch.no_grad():
        want = full(*[t.float() if t.is_floating_point() else t for t in inputs])
    codes = cfg.num_codes  # the end-of-line column is -inf in both: never sampled
    assert np.abs(got[0][..., :codes] - want[0].numpy()[..., :codes]).max() < 5e-2
    assert np.isneginf(got[0][..., codes:]).all() and np.isneginf(want[0].numpy()[..., codes:]).all()
    assert np.abs(want[0].numpy()[..., :codes]).max() > 0.1  # logits, not zeros


def test_the_shipped_pair_exports_with_no_option_and_paints_prompts(tmp_path, capsys, monkeypatch):
    """``vvs-export --model lumina-mgpt --out DIR`` exports the shipped pair (its drafter, VQGAN, tokenizer and
    decoding defaults); ``vvs-run --prompt`` paints 128 px images from it with AR and VVS; an official-folder option
    without --checkpoint is a one-line error."""
    from PIL import Image

    from tests.conftest import run_cli
    from vvs.cli.export import main as export
    from vvs.cli.run import main as run
    from vvs.engines.manifest import read_manifest

    out = tmp_path / "engines-lumina"
    code, _, err = run_cli(export, ["--model", "lumina-mgpt", "--out", out, "--resolution", "256"], capsys, monkeypatch)
    assert code == 2 and "go with --checkpoint" in err and err.strip().count("\n") == 0 and not out.exists(), err
    code, _, err = run_cli(export, ["--model", "lumina-mgpt", "--out", out], capsys, monkeypatch)
    assert code == 0, err
    manifest = read_manifest(out)
    assert manifest["model"]["source"] == "the shipped pair" and "draft_tree" in manifest["graphs"]
    code, stdout, err = run_cli(run, ["--engine", out, "--prompt", "a photo of a cat", "--mode", "ar,vvs",
                                      "--out", tmp_path / "images"], capsys, monkeypatch)
    assert code == 0, err
    for mode in ("ar", "vvs"):
        assert Image.open(tmp_path / "images" / f"{mode}_000_a-photo-of-a-cat.png").size == (128, 128)


def test_an_official_folder_takes_128_prompt_tokens_by_default(official):
    """Lumina-mGPT's instruction template alone takes about 20 tokens, so an official folder's prompt slots default
    to 128 (Janus-Pro's to 64); --prompt-tokens overrides it."""
    from vvs.families.lumina_mgpt.bundle import load_bundle

    folder, tokenizer_dir, _ = official
    for given, slots in ((None, 128), (40, 40)):
        bundle = load_bundle(str(folder), str(tokenizer_dir), prompt_tokens=given, resolution=GRID * 16)
        assert bundle.target.config.cls_token_num == slots
