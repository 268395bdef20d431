"""``vvs-export --prompt-tokens`` on the shipped prompt pairs (Janus-Pro, Lumina-mGPT): it was accepted and
ignored, while the too-long-prompt error told the user to re-export with it. Now it sets the shipped target's prompt
slots, and the target computes the same function on the prompts it took before (rotary positions are relative and
the left padding is masked), so a longer prompt fits without retraining."""
import importlib

import pytest
import torch

from vvs.models.layers import caption_causal_mask
from vvs.runtime.options import OptionsError

FAMILIES = ["janus_pro", "lumina_mgpt"]


def image_logits(bundle, prompt_ids, prompt: str, codes: torch.Tensor) -> torch.Tensor:
    """The target's logits for image tokens 1..n of ``codes`` after ``prompt``, as decoding sees them."""
    ids, valid = prompt_ids.encode([prompt])
    mask = caption_causal_mask(valid, ids.shape[1] + codes.shape[1])
    with torch.no_grad():
        out = bundle.target.teacher_forced(ids, codes, mask)
    return out.logits[:, ids.shape[1] - 1 : -1]


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_tokens_resizes_a_shipped_pair_without_changing_what_it_computes(family):
    load_bundle = importlib.import_module(f"vvs.families.{family}.bundle").load_bundle
    PromptIds = importlib.import_module(f"vvs.families.{family}.prompts").PromptIds
    shipped, wide = load_bundle(no_drafter=True), load_bundle(prompt_tokens=96, no_drafter=True)
    slots = shipped.target.config.cls_token_num
    assert wide.target.config.cls_token_num == 96 and slots < 96
    narrow_ids = PromptIds.from_file(shipped.tokenizer, shipped.target.config)
    wide_ids = PromptIds.from_file(wide.tokenizer, wide.target.config)

    codes = torch.tensor([[5, 17, 3]])  # within the first row: no forced token in Lumina-mGPT's stream
    prompt = "a red apple on a wooden table"
    torch.testing.assert_close(image_logits(wide, wide_ids, prompt, codes),
                               image_logits(shipped, narrow_ids, prompt, codes), rtol=1e-4, atol=1e-4)

    long_prompt = " ".join(["a small red house by a quiet lake"] * 3)
    length = len(narrow_ids.ids(long_prompt))
    assert slots < length <= 96
    with pytest.raises(OptionsError, match=f"this folder takes at most {slots}"):
        narrow_ids.encode([long_prompt])
    assert torch.isfinite(image_logits(wide, wide_ids, long_prompt, codes)).all()
