"""Lumina-mGPT's model sets: an official folder (the target), Chameleon's tokenizer folder (the VQGAN and the text
tokenizer) and an optional drafter, or the shipped pair; and ``vvs-export --model lumina-mgpt``."""
from __future__ import annotations

from pathlib import Path

from vvs.discrete.bundle import ModelBundle, with_prompt_slots
from vvs.discrete.loading import load_drafter
from vvs.errors import VVSError
from vvs.families.lumina_mgpt.family import SAMPLING
from vvs.families.lumina_mgpt.loading import load_lumina, load_official, load_official_vqgan, load_vqgan
from vvs.models.hub import folder_name
from vvs.models.loading import CheckpointError
from vvs.shipped import shipped_info, shipped_path

FAMILY = "lumina-mgpt"
TOKENIZER_FILES = ("tokenizer.json", "text_tokenizer.json")  # the checkpoint's own, or Chameleon's
# an official folder's prompt slots unless --prompt-tokens says otherwise: the instruction template takes about 20 of
# them, and Lumina-mGPT's users write sentences
PROMPT_TOKENS = 128


def text_tokenizer(checkpoint: Path, tokenizer_dir: Path) -> Path:
    """The prompt tokenizer: the checkpoint folder's ``tokenizer.json`` (Lumina-mGPT-7B-768 carries one), else
    Chameleon's ``text_tokenizer.json`` from its tokenizer folder."""
    for path in (checkpoint / TOKENIZER_FILES[0], tokenizer_dir / TOKENIZER_FILES[1]):
        if path.is_file():
            return path
    raise CheckpointError(tokenizer_dir, f"no text tokenizer: expected {checkpoint / TOKENIZER_FILES[0]} or "
                                         f"{tokenizer_dir / TOKENIZER_FILES[1]} (Chameleon's tokenizer folder)")


def load_bundle(checkpoint: str | None = None, tokenizer_dir: str | None = None, drafter: str | None = None,
                prompt_tokens: int | None = None, no_drafter: bool = False,
                resolution: int | None = None) -> ModelBundle:
    """An official folder with Chameleon's tokenizer folder and the vvs drafter ``drafter`` (None: drafter-free).
    ``resolution``: pixels per side (512, 768, 1024); None takes it from the folder's name. Without ``checkpoint``,
    the shipped pair (its own drafter unless ``drafter`` or ``no_drafter`` say otherwise; its resolution is its
    own, its prompt slots ``prompt_tokens`` or its own)."""
    if no_drafter and drafter:
        raise VVSError("options --drafter and --no-drafter: give one of them")
    if checkpoint is None:
        if tokenizer_dir is not None or resolution is not None:
            raise VVSError("options --tokenizer-dir and --resolution go with --checkpoint (an official Lumina-mGPT "
                           "folder); the shipped pair has its own")
        target = with_prompt_slots(load_lumina(shipped_path("lumina_target")), prompt_tokens)
        vq = load_vqgan(shipped_path("lumina_vqgan"))
        drafter = drafter or (None if no_drafter else str(shipped_path("lumina_drafter")))
        tokenizer = shipped_path("lumina_tokenizer")
    else:
        target, vq, tokenizer = load_official_pair(Path(checkpoint), tokenizer_dir, prompt_tokens, resolution)
    drafter_model = None if drafter is None else load_drafter(drafter, target.config)
    return ModelBundle(target, drafter_model, vq, FAMILY, tokenizer)


def load_official_pair(checkpoint: Path, tokenizer_dir: str | None, prompt_tokens: int | None,
                       resolution: int | None):
    """An official folder's target, Chameleon's VQGAN and the prompt tokenizer."""
    if resolution is not None and resolution % 32:
        raise VVSError(f"option --resolution {resolution}: Lumina-mGPT paints sides that are multiples of 32 pixels "
                       f"(its size tokens count 32 px); try {resolution // 32 * 32 or 32}")
    if tokenizer_dir is None:
        raise VVSError("--checkpoint of Lumina-mGPT needs --tokenizer-dir: Chameleon's tokenizer folder (vqgan.yaml, "
                       "vqgan.ckpt, text_tokenizer.json), which the official folders do not carry")
    tokenizer_path = Path(tokenizer_dir)
    target, codes = load_official(checkpoint, prompt_tokens or PROMPT_TOKENS, resolution and resolution // 16)
    vq = load_official_vqgan(tokenizer_path, codes)
    return target, vq, text_tokenizer(checkpoint, tokenizer_path)


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model lumina-mgpt``: an official folder (``--checkpoint``) with Chameleon's tokenizer folder,
    or the shipped pair."""
    from vvs.discrete.exporter import export_folder

    o = options
    bundle = load_bundle(o["checkpoint"], o["tokenizer_dir"], o["drafter"], o["prompt_tokens"], o["no_drafter"],
                         o["resolution"])
    echo(bundle.summary())
    if o["checkpoint"] is None:
        defaults, extra = shipped_info("shipped_lumina.json")["decoding_defaults"], {"source": "the shipped pair"}
    else:
        defaults, extra = SAMPLING, {"source": folder_name(o["checkpoint"])}
    return export_folder(bundle, out, o["precision"], o["max_draft_top_k"], o["lantern_k"], defaults, extra,
                         force=force, weights=o["weights"], drafter_weights=o["drafter_weights"],
                         torch_weights=o["torch_weights"])
