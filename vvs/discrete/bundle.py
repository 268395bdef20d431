"""The set of models one deployment of a discrete-token family needs: target, drafter, image tokenizer (each
family's ``load_bundle`` builds one from its official files or its shipped pair)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from torch import nn

from vvs.discrete.drafter import Drafter
from vvs.discrete.target import DiscreteTarget


def with_prompt_slots(target: DiscreteTarget, slots: int | None) -> DiscreteTarget:
    """A prompt-conditioned target with ``slots`` prompt slots. No weight depends on their count: positions are
    rotary (relative), and a prompt is left-padded with the padding masked, so a shipped pair trained with 48 slots
    takes longer prompts and computes the same function on the ones it took before."""
    if slots is None or slots == target.config.cls_token_num:
        return target
    resized = type(target)(replace(target.config, cls_token_num=slots))
    resized.load_state_dict(target.state_dict())
    return resized.eval()


@dataclass
class ModelBundle:
    target: DiscreteTarget
    drafter: Drafter | None  # None: a drafter-free folder (ar and the speculative Jacobi modes)
    vq: nn.Module  # the image tokenizer its TargetArch loads (vvs.models.vq.VQModel, Chameleon's VQGAN)
    family: str  # the registry entry whose target architecture ``target`` is
    tokenizer: Path | None = None  # the target's own text tokenizer.json, where prompts are its input (Janus-Pro)

    @property
    def arch(self):
        from vvs.families.registry import family

        return family(self.family).entry("target_arch")

    def summary(self) -> str:
        t, d, v = self.target.config, self.drafter and self.drafter.config, self.vq.config
        count = lambda m: sum(p.numel() for p in m.parameters()) / 1e6  # noqa: E731
        drafter = ("drafter none: ar, sjd, sjd-pac and gsd only" if d is None else
                   f"drafter {d.num_hidden_layers} layer(s), dim {d.hidden_size}, {count(self.drafter):.2f}M params "
                   "(+ the target's output head)")
        from vvs.families.registry import family

        kind = " ".join(filter(None, (family(self.family).label, getattr(t, "model_type", None))))
        return "\n".join([
            f"target  {kind}: {t.n_layer} layers, dim {t.dim}, {t.n_head} heads, vocab {t.vocab_size}, "
            f"{t.cls_token_num} condition slot(s) + {t.grid_size}x{t.grid_size} tokens, {count(self.target):.2f}M params",
            drafter,
            f"vq      codebook {v.codebook_size}x{v.codebook_embed_dim}, downsample {v.downsample}, "
            f"{count(self.vq):.2f}M params",
        ])
