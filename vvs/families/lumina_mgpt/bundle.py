"""Lumina-mGPT's model sets: an official folder (the target), Chameleon's tokenizer folder (the VQGAN and the text
tokenizer) and an optional drafter; and ``vvs-export --model lumina-mgpt``."""
from __future__ import annotations

from pathlib import Path

from vvs.errors import VVSError
from vvs.families.llamagen.bundle import ModelBundle
from vvs.families.llamagen.loading import load_drafter
from vvs.families.lumina_mgpt.loading import load_official, load_official_vqgan
from vvs.models.loading import CheckpointError

FAMILY = "lumina-mgpt"
# the official solver's image sampling: guidance 3, image top-k 2000, temperature 1 (create_logits_processor)
DECODING_DEFAULTS = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}
TOKENIZER_FILES = ("tokenizer.json", "text_tokenizer.json")  # the checkpoint's own, or Chameleon's


def text_tokenizer(checkpoint: Path, tokenizer_dir: Path) -> Path:
    """The prompt tokenizer: the checkpoint folder's ``tokenizer.json`` (Lumina-mGPT-7B-768 carries one), else
    Chameleon's ``text_tokenizer.json`` from its tokenizer folder."""
    for path in (checkpoint / TOKENIZER_FILES[0], tokenizer_dir / TOKENIZER_FILES[1]):
        if path.is_file():
            return path
    raise CheckpointError(tokenizer_dir, f"no text tokenizer: expected {checkpoint / TOKENIZER_FILES[0]} or "
                                         f"{tokenizer_dir / TOKENIZER_FILES[1]} (Chameleon's tokenizer folder)")


def load_bundle(checkpoint: str | None = None, tokenizer_dir: str | None = None, drafter: str | None = None,
                prompt_tokens: int = 64, no_drafter: bool = False, resolution: int | None = None) -> ModelBundle:
    """An official folder with Chameleon's tokenizer folder and the vvs drafter ``drafter`` (None: drafter-free).
    ``resolution``: pixels per side (512, 768, 1024); None takes it from the folder's name."""
    if no_drafter and drafter:
        raise VVSError("options --drafter and --no-drafter: give one of them")
    if checkpoint is None:
        raise VVSError("vvs ships no Lumina-mGPT pair yet: give --checkpoint (an official Lumina-mGPT folder) and "
                       "--tokenizer-dir (Chameleon's tokenizer folder)")
    if resolution is not None and resolution % 32:
        raise VVSError(f"option --resolution {resolution}: Lumina-mGPT paints sides that are multiples of 32 pixels "
                       f"(its size tokens count 32 px); try {resolution // 32 * 32 or 32}")
    if tokenizer_dir is None:
        raise VVSError("--checkpoint of Lumina-mGPT needs --tokenizer-dir: Chameleon's tokenizer folder (vqgan.yaml, "
                       "vqgan.ckpt, text_tokenizer.json), which the official folders do not carry")
    checkpoint_dir, tokenizer_path = Path(checkpoint), Path(tokenizer_dir)
    target, codes = load_official(checkpoint_dir, prompt_tokens, resolution and resolution // 16)
    vq = load_official_vqgan(tokenizer_path, codes)
    drafter_model = None if drafter is None else load_drafter(drafter, target.config)
    return ModelBundle(target, drafter_model, vq, FAMILY, text_tokenizer(checkpoint_dir, tokenizer_path))


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model lumina-mgpt``: an official folder (``--checkpoint``) with Chameleon's tokenizer folder."""
    from vvs.families.llamagen.exporter import export_folder

    o = options
    bundle = load_bundle(o["checkpoint"], o["tokenizer_dir"], o["drafter"], o["prompt_tokens"], o["no_drafter"],
                         o["resolution"])
    echo(bundle.summary())
    extra = {"source": Path(o["checkpoint"]).resolve().name}
    return export_folder(bundle, out, o["precision"], o["max_draft_top_k"], o["lantern_k"], DECODING_DEFAULTS, extra,
                         force=force, drafter_weights=o["drafter_weights"])
