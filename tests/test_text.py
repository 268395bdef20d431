"""Text-to-image from prompts: caption cleaning, tokenization, the ``text_encode`` graph, left padding and the
prompt paths of the Pipeline and vvs-run.

The encoder is a randomly initialised T5 of the official architecture, built and saved by ``transformers`` (the
real FLAN-T5-XL cannot be fetched here), with a Unigram tokenizer trained by ``tokenizers`` and saved in the same
folder, as a downloaded T5 is."""
import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from vvs.cli.run import main as run_main
from vvs.engines import load_engines
from vvs.runtime.options import OptionsError
from vvs.runtime.pipeline import Pipeline
from vvs.text.clean import preprocess
from vvs.text.encoder import left_pad

PROMPTS = ["A photo of a CAT", "a red bird on a branch, https://example.com/bird.jpg", "  two dogs\u2014playing  ",
           "日本 a bowl of soup", "a sunflower " * 80, "un café crème — très bon 🙂"]


def reference_captions(t5_dir, prompts, slots):
    """The official sampler's path with transformers: cleaned prompts, tokenizer padded to max length with
    truncation, last hidden state; then its left padding: the mask flipped, each row's valid states moved to the
    end (``cat(emb[n:], emb[:n])``) and the whole multiplied by the new mask."""
    from transformers import AutoTokenizer, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(t5_dir)
    batch = tok([preprocess(p) for p in prompts], max_length=slots, padding="max_length", truncation=True,
                return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
    with torch.no_grad():
        emb = T5EncoderModel.from_pretrained(t5_dir).eval()(**batch).last_hidden_state
    mask = torch.flip(batch["attention_mask"], dims=[-1])
    rows = [torch.cat([e[int(m.sum()):], e[:int(m.sum())]]) for e, m in zip(emb, batch["attention_mask"])]
    return torch.stack(rows) * mask[:, :, None], mask.bool(), batch


def test_text_encode_on_onnxruntime_and_torch_matches_transformers(text_folder, t5_dir):
    want, want_mask, batch = reference_captions(t5_dir, PROMPTS, 3)
    for backend in ("onnxruntime", "torch"):
        text = load_engines(text_folder, backend).text
        ids, mask = text.tokenize(PROMPTS)
        assert torch.equal(ids, batch["input_ids"]) and torch.equal(mask, batch["attention_mask"])
        got, got_mask = text.encode(PROMPTS)
        assert got.dtype == torch.float32 and torch.equal(got_mask, want_mask)
        assert (got - want).abs().max() <= 1e-5, backend


def test_tokens_at_120_slots_match_transformers_for_long_empty_and_unicode_prompts(t5_dir):
    """At LlamaGen's 120 slots: a prompt of ~240 words is cut to 119 tokens and the end-of-sequence token; CJK
    is removed by the cleaning, accents and emoji go through the tokenizer as transformers sends them."""
    from tokenizers import Tokenizer

    from vvs.text.encoder import TextEncoder

    text = TextEncoder(Tokenizer.from_file(str(t5_dir / "tokenizer.json")), None, 120, torch.device("cpu"))
    _, _, batch = reference_captions(t5_dir, PROMPTS, 120)
    ids, mask = text.tokenize(PROMPTS)
    assert torch.equal(ids, batch["input_ids"]) and torch.equal(mask, batch["attention_mask"])
    assert mask[4].sum() == 120 and ids[4, 119] == 1 and mask[0].sum() < 20
    with pytest.raises(OptionsError, match="prompt 2 of 2 is empty"):
        text.encode(["a cat", "   "])
    with pytest.raises(OptionsError, match=r"prompt 1 of 1 is not a string: b'a cat' \(bytes\)"):
        text.encode([b"a cat"])
    with pytest.raises(OptionsError, match=r"prompt 2 of 2 is not a string: 7 \(int\)"):  # once "is a int"
        text.encode(["a cat", 7])


def test_left_padding_moves_valid_states_last_and_zeroes_the_rest():
    hidden = torch.arange(2 * 5 * 2, dtype=torch.float32).reshape(2, 5, 2) + 1
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    padded, valid = left_pad(hidden, mask)
    assert valid.tolist() == [[False, False, False, True, True], [True] * 5]
    assert padded[0].tolist() == [[0, 0]] * 3 + hidden[0, :2].tolist()
    assert torch.equal(padded[1], hidden[1])


def test_clean_caption_as_llamagen_cleans_captions():
    assert preprocess("A Photo of a CAT") == "a photo of a cat"
    assert preprocess("a cat https://example.com/cat.jpg on a mat") == "a cat on a mat"
    assert preprocess("<b>bold</b> cat") == "bold cat"
    assert preprocess("日本 a cat") == "a cat"
    assert preprocess("a \u2014 cat \u201cquoted\u201d") == 'a - cat "quoted"'
    assert preprocess("this-is-my-cute-cat") == "this is my cute cat"
    assert preprocess("a%20cat @someone") == "a cat"
    assert preprocess("“a cat”") == "a cat"


@pytest.mark.parametrize("mode", ["ar", "vvs"])
def test_a_prompt_gives_the_tokens_its_embeddings_give(text_folder, t5_dir, mode):
    """The prompt path (Pipeline -> text encoder -> left padding) against the embedding path fed with the
    reference's captions, two images with their own seeds, on ONNX Runtime."""
    pipe = Pipeline(load_engines(text_folder, "onnxruntime"))
    prompts = ["a red bird", "a bowl of soup with noodles"]
    captions, mask, _ = reference_captions(t5_dir, prompts, 3)
    from_prompts = pipe.generate(prompts, mode=mode, seed=4, decode_images=False).tokens
    from_embeddings = pipe.generate(captions, mode=mode, seed=4, caption_mask=mask, decode_images=False).tokens
    assert torch.equal(from_prompts, from_embeddings)
    other = pipe.generate(["a mountain lake"] + prompts[1:], mode=mode, seed=4, decode_images=False).tokens
    assert not torch.equal(other[0], from_prompts[0]) and torch.equal(other[1], from_prompts[1])
    pipe.close()


def test_encoded_prompts_are_cached_and_chunked_to_the_engine(text_folder):
    engines = load_engines(text_folder, "onnxruntime")
    calls = []
    graph = engines.text.graph
    engines.text.graph = type("Counting", (), {"run": lambda self, **x: calls.append(len(x["input_ids"]))
                                               or graph.run(**x)})()
    first = engines.text.encode(["a cat", "a dog", "a cat"])
    second = engines.text.encode(["a dog", "a bird"])
    assert calls == [2, 1] and torch.equal(first[0][1], second[0][0])
    engines.text.max_rows = 2  # a TensorRT engine built for 2 images: new prompts go in twos
    prompts = ["a fish", "a tree", "a bird", "a boat", "a house", "a road"]
    chunked = engines.text.encode(prompts)
    assert calls[2:] == [2, 2, 1]
    whole = load_engines(text_folder, "onnxruntime").text.encode(prompts)
    assert torch.allclose(chunked[0], whole[0], atol=1e-6) and torch.equal(chunked[1], whole[1])


def test_prompts_and_classes_on_the_wrong_folder_are_one_line_errors(text_folder, tiny_folder):
    with pytest.raises(OptionsError, match="'a cat' is not a class of this class-conditional model"):
        Pipeline(load_engines(tiny_folder, "onnxruntime")).generate(["a cat"])
    with pytest.raises(OptionsError, match="caption_mask goes with caption embeddings"):
        Pipeline(load_engines(text_folder, "onnxruntime")).generate(["a cat"], caption_mask=torch.ones(1, 3))


def test_vvs_run_with_prompts(text_folder, tiny_folder, tmp_path, capsys, monkeypatch):
    """--prompt values, then --prompts FILE's lines, give the Pipeline's tokens; the index records each prompt; a bad
    file, a class on a t2i folder and a prompt on a c2i folder are one-line errors naming the flag to use."""
    captions = tmp_path / "captions.txt"
    captions.write_text("a red bird\n\na bowl of soup\n")
    tokens = tmp_path / "tokens.npy"
    code, _, err = run_cli(run_main, ["--engine", text_folder, "--prompts", captions, "--prompt", "a cat",
                                      "--mode", "vvs", "--seed", "5", "--out", tmp_path / "out",
                                      "--save-tokens", tokens], capsys, monkeypatch)
    assert code == 0, err
    want = Pipeline(load_engines(text_folder)).generate(["a cat", "a red bird", "a bowl of soup"], mode="vvs",
                                                       seed=5, decode_images=False).tokens
    assert np.array_equal(np.load(tokens), want.numpy())
    index = json.loads((tmp_path / "out" / ".vvs-run.json").read_text())
    assert len(index["files"]) == 4  # three images and the grid
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a cat\n\xff\xfe bird\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    for args, message in ((["--prompts", bad], "not UTF-8"), (["--class", "1"], "--prompt"),
                          (["--prompts", tmp_path / "none.txt"], "does not exist"),
                          (["--prompts", empty], f"option --prompts {empty}: the file holds no prompts"),
                          (["--prompt", "a cat", "--prompts", empty], "the file holds no prompts"),
                          (["--prompt", "a cat", "--prompt", " "], "prompt 2 of 2 is empty")):
        code, _, err = run_cli(run_main, ["--engine", text_folder, *args, "--out", tmp_path / "o2"], capsys,
                               monkeypatch)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(run_main, ["--engine", tiny_folder, "--prompt", "a cat", "--out", tmp_path / "o3"], capsys,
                           monkeypatch)
    assert code == 2 and "class-conditional; give --class" in err, err


def test_text_encode_builds_in_tensorrt_rtx(text_folder):
    """The real TensorRT-RTX builder (no GPU needed) takes the text_encode graph with the profile vvs-export
    --backend tensorrt-rtx gives it, and the network's I/O is the spec's."""
    pytest.importorskip("tensorrt_rtx", reason="the test set-up installs tensorrt-rtx-cu13 from PyPI")
    from vvs.engines.manifest import graph_spec, read_manifest
    from vvs.engines.tensorrt_build import FLAVOURS, build_engine, polygraphy_trt, shape_ranges

    manifest = read_manifest(text_folder)
    profiles = shape_ranges(manifest, "text_encode", 4)
    assert profiles == [{"input_ids": ((1, 3), (4, 3), (4, 3)), "attention_mask": ((1, 3), (4, 3), (4, 3))}]
    onnx_path = text_folder / manifest["graphs"]["text_encode"]["file"]
    plan = build_engine(FLAVOURS["tensorrt-rtx"], onnx_path, "text_encode", profiles, [(8, 6)], None)
    assert len(plan) > 10_000
    builder, network, parser = polygraphy_trt(FLAVOURS["tensorrt-rtx"]).NetworkFromOnnxPath(str(onnx_path))()
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    tensors += [network.get_output(i) for i in range(network.num_outputs)]
    spec = graph_spec(manifest, "text_encode")
    assert {t.name: len(t.shape) for t in tensors} == {t.name: len(t.shape) for t in (*spec.graph_inputs, *spec.outputs)}


def test_vvs_bench_with_prompts(text_folder, tmp_path, capsys, monkeypatch):
    """vvs-bench on a text-conditional folder: the prompts are its images (no class statistics); AR makes one
    token per target forward, VVS more."""
    from vvs.cli.bench import main as bench_main

    code, out, err = run_cli(bench_main, ["--engine", text_folder, "--prompt", "a red bird", "--prompt", "a cat",
                                          "--mode", "ar,vvs", "--num-seeds", "2", "--out", tmp_path / "bench"],
                             capsys, monkeypatch)
    assert code == 0, err
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert results["num_images"] == 2
    modes = results["modes"]
    assert modes["ar"]["tokens_per_target_forward"] == 1.0 and modes["vvs"]["tokens_per_target_forward"] > 1.2
