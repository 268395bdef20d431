"""Janus-Pro's generation path: numeric parity with transformers' ``JanusForConditionalGeneration`` (the reference
implementation), strict loading of official folders, and prompts as the official script builds them."""
from __future__ import annotations

import pytest
import torch

from tests.janus_reference import BOI, BOS, GRID, PAD, hf_janus, write_official_folder
from vvs.families.janus_pro.loading import load_official
from vvs.families.janus_pro.model import guidance_null
from vvs.families.janus_pro.prompts import PromptIds, conversation
from vvs.models.layers import causal_mask
from vvs.models.loading import CheckpointError

TOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return hf_janus()


@pytest.fixture(scope="module")
def official(reference, tmp_path_factory):
    """The reference's weights as an official folder, and what vvs loads from it (prompts of up to 12 tokens)."""
    folder = write_official_folder(reference, tmp_path_factory.mktemp("janus") / "Janus-Pro-tiny")
    target, vq = load_official(folder, prompt_slots=12, grid_size=GRID)
    return folder, target, vq


def prompt_ids(folder, target, text="a red cat on the hill"):
    return PromptIds.from_file(folder / "tokenizer.json", target.config).ids(text)


@torch.no_grad()
def test_logits_match_transformers_for_a_prefill_and_cached_steps(reference, official):
    folder, target, _ = official
    ids = torch.tensor([prompt_ids(folder, target), prompt_ids(folder, target, "a blue dog at the river")])
    c = ids.shape[1]
    lm = reference.model.language_model
    ref = lm(input_ids=ids, use_cache=True)
    ref_logits = reference.model.generation_head(ref.last_hidden_state)
    ours = target(condition=ids, position_ids=torch.arange(c).expand(2, -1), mask=causal_mask(c))
    torch.testing.assert_close(ours.logits, ref_logits, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden, ref.last_hidden_state, atol=TOL, rtol=0)
    # cached decode steps: codes go in through gen_embed -> gen_aligner, a step of one and a step of three
    cache, kv = ref.past_key_values, ours.new_kv
    codes = torch.randint(0, target.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1))
    for start, stop in ((0, 1), (1, 4)):
        step_codes = codes[:, start:stop]
        embeds = reference.prepare_embeddings_for_image_generation(step_codes)
        positions = torch.arange(c + start, c + stop).expand(2, -1)
        ref = lm(inputs_embeds=embeds, past_key_values=cache, position_ids=positions, use_cache=True)
        cache = ref.past_key_values
        t = stop - start
        mask = torch.ones(1, 1, t, c + stop, dtype=torch.bool)
        mask[..., c + start:] = causal_mask(t)
        ours = target(tokens=step_codes, position_ids=positions, mask=mask, past_kv=kv)
        kv = torch.cat([kv, ours.new_kv], dim=4)
        torch.testing.assert_close(ours.logits, reference.model.generation_head(ref.last_hidden_state),
                                   atol=TOL, rtol=0)


def test_official_folder_loads_strictly(reference, official, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder, target, vq = official
    assert target.config.vocab_size == 16384 and vq.config.codebook_size == 16384
    assert (target.config.bos_id, target.config.pad_id, target.config.boi_id) == (BOS, PAD, BOI)
    stored = {k: v for shard in folder.glob("model-*.safetensors") for k, v in load_file(shard).items()}
    assert torch.equal(vq.quantize.embedding.weight, stored["gen_vision_model.quantize.embedding.weight"])
    assert torch.equal(target.gen_head.vision_head.bias, stored["gen_head.vision_head.bias"])
    # a key the generation path does not have, a missing key, a wrong shape: one line each, naming the folder
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    state = load_file(shard)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    key = next(k for k in state if k.startswith("gen_head."))
    for change, expected in (("extra", "unexpected key"), ("missing", "missing 1 key"), ("shape", "wrong shape")):
        edited = dict(state)
        if change == "extra":
            edited["gen_head.extra.weight"] = torch.zeros(2)
        elif change == "missing":
            del edited[key]
        else:
            edited[key] = torch.zeros(3, 3)
        save_file(edited, shard)
        with pytest.raises(CheckpointError) as err:
            load_official(broken, prompt_slots=12)
        message = str(err.value)
        assert expected in message and str(broken) in message and "\n" not in message, message
    save_file(state, shard)
    del index["weight_map"]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="weight_map"):
        load_official(broken, prompt_slots=12)


def test_prompt_is_the_official_conversation_and_the_null_keeps_bos_and_image_start(official):
    folder, target, _ = official
    assert conversation("a red cat") == "<|User|>: a red cat\n\n<|Assistant|>:<begin_of_image>"
    builder = PromptIds.from_file(folder / "tokenizer.json", target.config)
    ids, mask = builder.encode(["a red cat", "a big dog on the hill"])
    short = builder.ids("a red cat")
    assert short[0] == BOS and short[-1] == BOI and short.count(BOS) == 1
    assert ids[0, -len(short):].tolist() == short and not mask[0, : -len(short)].any() and mask[0, -len(short):].all()
    assert (ids[0, : -len(short)] == PAD).all()
    null = guidance_null(ids, PAD)
    for row, length in ((0, len(short)), (1, int(mask[1].sum()))):
        first = ids.shape[1] - length
        assert null[row, first] == BOS and null[row, -1] == BOI
        assert (null[row, first + 1: -1] == PAD).all() and (null[row, :first] == PAD).all()
    with pytest.raises(Exception, match="at most 12"):
        builder.encode(["a photo of a small red cat on the big hill at night on a sunny day"])


@pytest.fixture(scope="module")
def bundle(official):
    """The official folder's target and VQ with a random drafter of the target's width (an untrained drafter:
    speculative modes accept little, exact ones must still give the target's tokens)."""
    from vvs.discrete.drafter import Drafter, DrafterConfig
    from vvs.families.janus_pro.bundle import load_bundle
    from vvs.models.loading import save_model

    folder, target, _ = official
    torch.manual_seed(3)
    drafter = Drafter(DrafterConfig.for_target(target.config), target.config)
    drafter.embed_tokens.weight.data.copy_(target.embedding_table().detach())
    path = save_model(drafter, folder.parent / "drafter.safetensors", "drafter")
    return load_bundle(str(folder), str(path), prompt_tokens=16, grid_size=GRID)


GREEDY = dict(temperature=0.0, top_k=0, top_p=1.0, cfg_scale=5.0, tree_size=6, depth=2, draft_top_k=2)
PROMPTS = ["a red cat on the hill", "a big dog", "a photo of a small green tree at night"]


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(reference, bundle):
    """vvs's ar mode through the shared loop (left-padded batch of three prompt lengths, guidance 5) against
    transformers' image generation, one prompt at a time (unpadded), token for token."""
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", **GREEDY))
    ours = pipe.generate(PROMPTS, decode_images=False).tokens
    builder = pipe.engines.conditioning.prompts
    for prompt, row in zip(PROMPTS, ours):
        ids = torch.tensor([builder.ids(prompt)])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                      do_sample=False, guidance_scale=5.0)
        assert row.tolist() == expected[0].tolist(), prompt
    assert len(set(map(tuple, ours.tolist()))) == len(PROMPTS)  # the prompts matter


@torch.no_grad()
def test_speculative_modes_run_a_janus_target(bundle):
    """Greedy sd (exact) gives ar's tokens; vvs and the drafter-free sjd-pac decode to the end."""
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", **GREEDY))
    ar = pipe.generate(PROMPTS, decode_images=False)
    sd = pipe.generate(PROMPTS, mode="sd", decode_images=False)
    assert torch.equal(sd.tokens, ar.tokens)
    assert sd.aggregate()["target_forwards"] <= ar.aggregate()["target_forwards"]
    for mode in ("vvs", "sjd-pac"):
        out = pipe.generate(PROMPTS, mode=mode, decode_images=False, temperature=1.0, seed=4)
        assert out.tokens.shape == (3, GRID * GRID) and int(out.tokens.max()) < bundle.target.config.vocab_size


from tests.conftest import JANUS_PROMPTS as SHORT_PROMPTS  # noqa: E402 (within the small bundle's 12 slots)


@torch.no_grad()
def test_an_exported_folder_decodes_as_the_torch_modules_on_onnxruntime(janus_bundle, janus_folder):
    """The engine folder (graphs, tables, the target's tokenizer) on ONNX Runtime and on the torch backend: the
    torch modules' tokens, greedy ar and sd, sampled sd draw for draw, and vvs to pixels."""
    import json

    from vvs.discrete.engines import torch_engines
    from vvs.engines import load_engines
    from vvs.runtime.pipeline import Pipeline

    manifest = json.loads((janus_folder / "manifest.json").read_text())
    assert manifest["model"]["family"] == "janus-pro" and manifest["prompts"] == {"tokenizer": "tokenizer.json"}
    assert manifest["decoding_defaults"]["cfg_scale"] == 5.0 and manifest["decoding_defaults"]["top_k"] == 0
    ort = Pipeline(load_engines(janus_folder, "onnxruntime", threads=1))
    ref = Pipeline(torch_engines(janus_bundle, default_options=manifest["decoding_defaults"]))
    for mode, options in (("ar", {"temperature": 0.0}), ("sd", {"temperature": 0.0}), ("sd", {"top_k": 50})):
        ours = ort.generate(SHORT_PROMPTS, mode=mode, seed=11, decode_images=False, **options).tokens
        torch_tokens = ref.generate(SHORT_PROMPTS, mode=mode, seed=11, decode_images=False, **options).tokens
        assert torch.equal(ours, torch_tokens), (mode, options)
    images = ort.generate(SHORT_PROMPTS[:1], mode="vvs", seed=2).images
    side = janus_bundle.target.config.grid_size * janus_bundle.vq.config.downsample
    assert images.shape == (1, 3, side, side)
    folder_pipe = Pipeline(load_engines(janus_folder, "torch"))
    assert torch.equal(folder_pipe.generate(SHORT_PROMPTS, mode="ar", temperature=0.0, decode_images=False).tokens,
                       ort.generate(SHORT_PROMPTS, mode="ar", temperature=0.0, decode_images=False).tokens)


def test_cli_exports_an_official_folder_and_runs_prompts(official, tmp_path, capsys, monkeypatch):
    """``vvs-export --model janus-pro --checkpoint FOLDER`` (the official 24 x 24 codes, no drafter: the best exact
    drafter-free mode becomes the default), then ``vvs-run --prompt``; bad requests are one-line errors."""
    from tests.conftest import run_cli
    from vvs.cli.export import main as export
    from vvs.cli.run import main as run

    folder = official[0]
    out = tmp_path / "engines-janus"
    for args, message in ((["--model", "janus-pro", "--checkpoint", folder, "--drafter", "d.safetensors",
                            "--no-drafter"], "options --drafter and --no-drafter: give one of them"),
                          (["--model", "janus-pro", "--checkpoint", folder / "config.json"], "not a folder")):
        code, _, err = run_cli(export, [*args, "--out", out], capsys, monkeypatch)
        assert code == 2 and message in err and err.strip().count("\n") == 0, err
        assert not out.exists()
    code, stdout, err = run_cli(export, ["--model", "janus-pro", "--checkpoint", folder, "--no-drafter", "--out", out,
                                         "--prompt-tokens", "16"], capsys, monkeypatch)
    assert code == 0, err
    assert 'next: vvs-run --engine' in stdout and '--prompt' in stdout
    code, stdout, err = run_cli(run, ["--engine", out, "--prompt", "a red cat", "--out", tmp_path / "images"],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "sjd-pac" in stdout and (tmp_path / "images" / "sjd-pac_000_a-red-cat.png").is_file()
    code, _, err = run_cli(run, ["--engine", out, "--class", "3"], capsys, monkeypatch)
    assert code == 2 and "text-conditional; give --prompt" in err
    code, _, err = run_cli(run, ["--engine", out, "--prompt", "a photo of a red cat on the big hill at night on a "
                                 "sunny day", "--out", tmp_path / "x"], capsys, monkeypatch)
    assert code == 2 and "tokens with the chat template; this folder takes at most 16" in err, err


@torch.no_grad()
def test_the_drafter_mixes_guidance_after_janus_mlp_head(bundle):
    """Guidance is linear but Janus-Pro's head is not: the drafter scores each row, then mixes the logits (mixing
    the hidden states first, right for LlamaGen's linear head, gives other candidates here)."""
    from vvs.discrete.graphs import Proposer
    from vvs.runtime.sampling import cfg_matrix, mix

    head = bundle.target.head
    proposer = Proposer(head, top_k=8)
    assert not proposer.linear
    hidden = torch.randn(4, 1, bundle.target.config.dim, generator=torch.Generator().manual_seed(0)) * 3
    cfg_mix = cfg_matrix(2, 5.0)
    args = (torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([1]))
    logp, ids = proposer(hidden, cfg_mix, *args)
    expected = mix(cfg_mix, head(hidden)).log_softmax(-1).topk(8, dim=-1)
    assert torch.equal(ids, expected.indices)
    torch.testing.assert_close(logp, expected.values, atol=1e-5, rtol=0)
    assert not torch.equal(head(mix(cfg_mix, hidden)).topk(8, dim=-1).indices, ids)


@torch.no_grad()
def test_an_image_does_not_depend_on_the_rest_of_its_batch(bundle):
    """Batch invariance with prompts of different lengths (different padding): a prompt's image from a batch of
    three equals its image alone with the same seed, sampled sd and vvs; and under continuous batching."""
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="sd", **{**GREEDY, "temperature": 1.0, "top_k": 40}),
                    max_batch=3)
    for mode in ("sd", "vvs"):
        together = pipe.generate(PROMPTS, mode=mode, seed=7, decode_images=False).tokens
        for i, prompt in enumerate(PROMPTS):
            alone = pipe.generate([prompt], mode=mode, seed=7 + i, decode_images=False).tokens
            assert torch.equal(alone[0], together[i]), (mode, prompt)
    jobs = [pipe.submit([p], seed=7 + i) for i, p in enumerate(PROMPTS)]  # joins a running batch
    joined = torch.cat([job.result().tokens for job in jobs])
    assert torch.equal(joined, pipe.generate(PROMPTS, seed=7, decode_images=False).tokens)


def test_vvs_train_janus_drafter_on_an_official_folder(official, tmp_path, capsys, monkeypatch):
    """``vvs-train janus-drafter``: codes and prompts in an .npz, a drafter out that the folder's export takes; a
    dataset of the wrong shape is a one-line error."""
    import numpy as np

    from tests.conftest import run_cli
    from vvs.cli.train import main

    folder = official[0]
    data = tmp_path / "codes.npz"
    tokens = np.random.default_rng(0).integers(0, 16384, (6, GRID * GRID))
    np.savez(data, tokens=tokens, prompts=np.array(["a red cat", "a big dog", "a tree"] * 2))
    code, out, err = run_cli(main, ["janus-drafter", "--checkpoint", folder, "--data", data, "--out",
                                    tmp_path / "d", "--steps", "3", "--batch", "2"], capsys, monkeypatch)
    assert code == 0, err
    from vvs.families.janus_pro.bundle import load_bundle

    bundle = load_bundle(str(folder), str(tmp_path / "d" / "drafter.safetensors"), prompt_tokens=16, grid_size=GRID)
    assert bundle.drafter.config.hidden_size == bundle.target.config.dim
    np.savez(data, tokens=tokens[:, :5], prompts=np.array(["a red cat"] * 6))
    code, _, err = run_cli(main, ["janus-drafter", "--checkpoint", folder, "--data", data, "--out", tmp_path / "e"],
                           capsys, monkeypatch)
    assert code == 2 and "tokens must be [M, grid x grid]" in err and err.strip().count("\n") == 0, err
