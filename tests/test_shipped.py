"""The shipped model set: integrity, and quality bars measured once and recorded in docs/shipped_model.md."""
import json
from dataclasses import replace

import pytest
import torch

from vvs.discrete.engines import torch_engines, torch_text_encoder
from vvs.engines.manifest import sha256
from vvs.families.llamagen.bundle import load_bundle
from vvs.quality import Instruments, top_left_speck_ratio
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline
from vvs.shipped import SHIPPED_DIR, shipped_info, shipped_text_encoder
from vvs.train.classifier import accuracy, real_crops
from vvs.train.data import PHOTOS
from vvs.train.shipped import HELDOUT_SEED, load_classifier
from vvs.train.tokenizer import flat_grid_deviation, region_errors, tokenizer_psnr, top_left_excess

PSNR_BAR_DB = 21.0  # shipped.json: 25.0 dB mean on 256 held-out crops (through their interior codes)
CLASSIFIER_BAR = 0.6  # chance is 1/16
GENERATED_BAR = 0.4
CORNER_EXCESS_BAR = 1.10  # the top-left's reconstruction error over the other corners' mean
SPECK_BAR = 1.2  # the top-left corner's specks over the worst other corner's, in generated images


@pytest.fixture(scope="module")
def bundle():
    return load_bundle()


@pytest.fixture(scope="module")
def classifier():
    return load_classifier(SHIPPED_DIR / "classifier.safetensors")


@pytest.fixture(scope="module")
def ar_samples(bundle):
    """32 AR images, two per class, with the shipped decoding defaults."""
    opts = DecodeOptions.from_dict(shipped_info()["decoding_defaults"]).updated(mode="ar")
    labels = torch.arange(32) % bundle.target.config.num_classes
    return labels, Pipeline(torch_engines(bundle), opts).generate(labels, seed=0)


def test_weights_match_their_description():
    info = shipped_info()
    total = 0
    for name, entry in info["files"].items():
        path = SHIPPED_DIR / entry["file"]
        assert sha256(path) == entry["sha256"], f"{path.name} differs from shipped.json"
        total += path.stat().st_size
    assert total <= 20e6
    assert len(info["classes"]) == 16 and all(c["licence"] for c in info["classes"])
    assert json.loads(json.dumps(info))["seed"] == 0


@pytest.fixture(scope="module")
def heldout_crops():
    """64 held-out crops in [-1, 1]."""
    return real_crops(64, HELDOUT_SEED + 7)[0] * 2 - 1


@torch.no_grad()
def test_tokenizer_reconstructs_heldout_crops(bundle, heldout_crops):
    assert tokenizer_psnr(bundle.vq, heldout_crops).mean() > PSNR_BAR_DB


@torch.no_grad()
def test_no_corner_of_a_decoded_image_is_special(bundle, heldout_crops):
    """The shipped decoder once painted a blob into the top-left corner of every image. Grids of one repeated code
    must decode flat in every corner, and held-out crops (each also mirrored three ways, so the same pixels visit
    every corner) must be reconstructed through their interior codes as well in the top-left as in the other
    corners. The zero-padded decoder shipped before fails both: flat-grid deviation 0.029 top-left, 0.016-0.021
    elsewhere; top-left error 1.137x the other corners' on these crops through their own codes (the first
    reflection-padded decoder: 0 everywhere, 1.090x; the shipped one, trained on interior codes: 0.999x on 256
    held-out crops)."""
    flat = flat_grid_deviation(bundle.vq, bundle.target.config.grid_size)
    assert max(flat[k] for k in ("top-left", "top-right", "bottom-left", "bottom-right")) < 0.005, flat
    errors = region_errors(bundle.vq, heldout_crops)
    assert top_left_excess(errors) <= CORNER_EXCESS_BAR, errors


@torch.no_grad()
def test_classifier_recognises_heldout_crops(classifier):
    images, labels = real_crops(128, HELDOUT_SEED + 8)
    assert accuracy(classifier, images, labels) > CLASSIFIER_BAR


def test_generated_images_show_their_class(ar_samples, classifier):
    labels, gen = ar_samples
    assert accuracy(classifier, gen.images, labels) > GENERATED_BAR


def test_generated_images_have_no_specks_in_the_top_left(ar_samples):
    """The target once learnt the codes that the zero-padded encoder gives cells near the border, and painted
    coloured specks into the third and fourth pixel rows of 8 at the left of most images: top-left 2.2x the worst
    other corner on these 32 images. Trained on interior codes (each crop encoded inside its mirrored canvas), the
    top-left is no more specked than the other corners."""
    _, gen = ar_samples
    assert top_left_speck_ratio(gen.images) <= SPECK_BAR


def test_domain_fid_tells_real_structure_from_shuffled_tokens(bundle, ar_samples, classifier):
    labels, gen = ar_samples
    instruments = Instruments(classifier, bundle.target)
    real = instruments.evaluate(gen.images, gen.tokens, labels)
    perm = torch.randperm(gen.tokens.shape[1], generator=torch.Generator().manual_seed(0))
    shuffled_tokens = gen.tokens[:, perm]
    with torch.no_grad():
        shuffled_images = bundle.vq.decode_codes(shuffled_tokens, bundle.target.config.grid_size)
    shuffled = instruments.evaluate(shuffled_images, shuffled_tokens, labels)
    assert shuffled["domain_fid"] > 1.5 * real["domain_fid"]
    assert shuffled["nll"] > real["nll"] + 0.5


# ----------------------------------------------------------------------------- the MAR pair

MAR_GENERATED_BAR = 0.3  # AR samples were classified into their class 62.5 % of the time (16 images x 2 seeds)


def test_mar_weights_match_their_description():
    from vvs.families.mar.bundle import load_mar_bundle

    info = shipped_info("shipped_mar.json")
    for role, entry in info["files"].items():
        assert sha256(SHIPPED_DIR / entry["file"]) == entry["sha256"], f"{entry['file']} differs from shipped_mar.json"
    bundle = load_mar_bundle()
    assert bundle.target.config.to_dict() == info["files"]["target"]["config"]
    assert bundle.draft.config.to_dict() == info["files"]["draft"]["config"]
    assert info["tokenizer"]["heldout_psnr_db_continuous"] > info["tokenizer"]["heldout_psnr_db_codes"]


def test_mar_samples_show_their_class(classifier):
    """One AR and one CSpD image for every other class with the shipped defaults: both recognisably
    class-conditional."""
    from vvs.families.mar.bundle import load_mar_bundle
    from vvs.families.mar.engines import torch_mar_engines
    from vvs.families.mar.pipeline import MARPipeline

    b = load_mar_bundle()
    pipe = MARPipeline(torch_mar_engines(b.target, b.draft, b.tokenizer, b.image_size,
                                         default_options=b.decoding_defaults))
    labels = torch.arange(0, 16, 2)
    for mode in ("ar", "cspd"):
        gen = pipe.generate(labels, mode=mode, seed=0)
        assert gen.tokens.abs().max() < 3.5  # the clipped sampler keeps latents in their range
        with torch.no_grad():
            hits = (classifier(gen.images).argmax(-1) == labels).float().mean()
        assert hits > MAR_GENERATED_BAR, mode


# ----------------------------------------------------------------------------- the text-to-image pair

T2I_GENERATED_BAR = 0.6  # bench/t2i_quality.py: 0.94 (each photograph's first caption, 16 x 2 images, seeds 0-31)


def test_t2i_weights_match_their_description():
    info = shipped_info("shipped_t2i.json")
    for entry in info["files"].values():
        assert sha256(SHIPPED_DIR / entry["file"]) == entry["sha256"]
    assert sorted(info["captions"]) == sorted(p.name for p in PHOTOS)
    bundle = load_bundle(t2i=True)
    assert bundle.target.config.model_type == "t2i" and bundle.target.config.caption_dim == 64


@pytest.fixture(scope="module")
def t2i_samples():
    """16 AR images from prompts, one per photograph (its first caption), shipped defaults."""
    bundle = load_bundle(t2i=True)
    engines = torch_engines(bundle)
    engines.text = torch_text_encoder(shipped_text_encoder(), bundle.target.config.cls_token_num)
    info = shipped_info("shipped_t2i.json")
    prompts = [info["captions"][p.name][0] for p in PHOTOS]
    opts = DecodeOptions.from_dict(info["decoding_defaults"]).updated(mode="ar")
    return torch.arange(len(PHOTOS)), Pipeline(engines, opts).generate(prompts, seed=0)


def test_t2i_images_show_what_their_prompt_describes(t2i_samples, classifier):
    """The classifier of the quality instruments recognises the photograph a prompt describes in the image made
    from it (chance: 1/16)."""
    photos, gen = t2i_samples
    assert accuracy(classifier, gen.images, photos) > T2I_GENERATED_BAR


# ----------------------------------------------------------------------------- the Janus-Pro pair

JANUS_GENERATED_BAR = 0.5  # bench/t2i_quality.py --engine engines-janus: 0.78 (first captions, 16 x 2 images)


def test_janus_weights_match_their_description():
    from vvs.families.janus_pro.bundle import load_bundle as load_janus_bundle

    info = shipped_info("shipped_janus.json")
    for entry in info["files"].values():
        assert sha256(SHIPPED_DIR / entry["file"]) == entry["sha256"]
    assert info["captions"] == shipped_info("shipped_t2i.json")["captions"]  # the same data as the t2i pair
    bundle = load_janus_bundle()
    assert bundle.family == "janus-pro" and bundle.target.config.vocab_size == bundle.vq.config.codebook_size


def test_janus_images_show_what_their_prompt_describes(classifier):
    """The shipped Janus-Pro pair's AR images from each photograph's first caption, as for the t2i pair."""
    from vvs.families.janus_pro.bundle import load_bundle as load_janus_bundle

    info = shipped_info("shipped_janus.json")
    prompts = [info["captions"][p.name][0] for p in PHOTOS]
    opts = DecodeOptions.from_dict(info["decoding_defaults"]).updated(mode="ar")
    gen = Pipeline(torch_engines(load_janus_bundle()), opts).generate(prompts, seed=0)
    assert accuracy(classifier, gen.images, torch.arange(len(PHOTOS))) > JANUS_GENERATED_BAR


# ----------------------------------------------------------------------------- the Lumina-mGPT pair

LUMINA_GENERATED_BAR = 0.5  # bench/t2i_quality.py --engine engines-lumina: see docs/shipped_model.md


@pytest.fixture(scope="module")
def lumina():
    from vvs.families.lumina_mgpt.bundle import load_bundle as load_lumina_bundle

    return load_lumina_bundle()


def test_lumina_weights_match_their_description(lumina):
    """The files are the recorded ones; the target has Chameleon-7B's head dimension (so --scale inflates it by
    whole heads), Chameleon's special ids, and a stream of the VQGAN's codes and the end-of-line token; the text
    tokenizer numbers the specials as Chameleon's does."""
    from tokenizers import Tokenizer

    info = shipped_info("shipped_lumina.json")
    for entry in info["files"].values():
        assert sha256(SHIPPED_DIR / entry["file"]) == entry["sha256"]
    assert info["captions"] == shipped_info("shipped_t2i.json")["captions"]  # the same data as the t2i pair
    cfg = lumina.target.config
    assert lumina.family == "lumina-mgpt" and cfg.head_dim == 128
    assert cfg.vocab_size == lumina.vq.config.n_embed + 1 and cfg.side_pixels == 128
    tokenizer = Tokenizer.from_file(str(lumina.tokenizer))
    ids = {name: tokenizer.token_to_id(name) for name in
           ("<s>", "<pad>", "<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>", "<reserved08804>")}
    assert ids == {"<s>": cfg.bos_id, "<pad>": cfg.pad_id, "<racm3:break>": cfg.boi_id, "<eoss>": cfg.eoi_id,
                   "<reserved08706>": cfg.sep_id, "<reserved08799>": cfg.eol_id,
                   "<reserved08804>": cfg.size_token(cfg.grid_size)}
    assert (cfg.bos_id, cfg.boi_id, cfg.sep_id, cfg.eol_id) == (1, 8197, 8710, 8803)


@torch.no_grad()
def test_the_lumina_vqgan_is_the_shipped_vq_in_chameleons_architecture(bundle, lumina, heldout_crops):
    """The Chameleon VQGAN encodes held-out crops to the shipped VQ's codes (99.8 %: its unit-length codebook rows
    are stored in half precision, as every shipped weight, which flips near-ties) and paints codes as the shipped
    decoder does, to that rounding; with Chameleon's zero padding in place of the shipped decoder's reflection the pictures differ
    (30 dB apart), so the padding is what the file's config says."""
    from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN
    from vvs.train.tokenizer import interior_codes

    same = lumina.vq.encode(heldout_crops) == bundle.vq.encode(heldout_crops).indices
    assert same.float().mean() > 0.995
    codes = interior_codes(bundle.vq, heldout_crops)
    grid = bundle.target.config.grid_size
    shipped = bundle.vq.decode_codes(codes, grid)
    assert (lumina.vq.decode(codes, grid, grid) - shipped).abs().max() < 2 / 255  # measured 0.7 / 255
    zeros = ChameleonVQGAN(replace(lumina.vq.config, decoder_padding="zeros")).eval()
    zeros.load_state_dict(lumina.vq.state_dict())
    assert (zeros.decode(codes, grid, grid) - shipped).abs().max() > 0.05


def test_lumina_images_show_what_their_prompt_describes(lumina, classifier):
    """The shipped Lumina-mGPT pair's AR images from each photograph's first caption, as for the t2i pair; every
    row closed by the end-of-line token, no corner more specked than the others (a zero-padded decoder specked the
    top-left: 1.35x the worst other corner on these images)."""
    info = shipped_info("shipped_lumina.json")
    prompts = [info["captions"][p.name][0] for p in PHOTOS]
    opts = DecodeOptions.from_dict(info["decoding_defaults"]).updated(mode="ar")
    gen = Pipeline(torch_engines(lumina), opts).generate(prompts, seed=0)
    cfg = lumina.target.config
    assert (gen.tokens.view(len(prompts), cfg.grid_size, cfg.grid_size + 1)[..., -1] == cfg.eol).all()
    assert accuracy(classifier, gen.images, torch.arange(len(PHOTOS))) > LUMINA_GENERATED_BAR
    assert top_left_speck_ratio(gen.images) <= SPECK_BAR
