"""Train an EAGLE/LANTERN drafter for any discrete-token target (LlamaGen's GPT, Janus-Pro, Lumina-mGPT)
(the recipe of LANTERN's ``train_drafter``).

Data: token sequences ``[M, N]`` of real images (ground-truth codes) with their conditions. Per batch the
frozen target runs teacher-forced over ``[condition ‖ tokens]`` (with probability ``class_dropout`` on the
null condition, since the drafter also serves the unconditional half under guidance) and gives the
post-norm features ``h``. Drafter slot ``p`` consumes (token at position ``p + 1``, ``h[p]`` + uniform noise) and
is trained to regress ``h[p + 1]`` (SmoothL1) and to match the target's distribution ``softmax(head(h[p + 1]))``
(cross-entropy, weight 0.1). Unlike the official run, the first image slot (``p = C - 1``) is in the loss.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from vvs.discrete.drafter import Drafter, DrafterConfig
from vvs.discrete.target import DiscreteTarget
from vvs.models.layers import caption_causal_mask, causal_mask
from vvs.train.loop import Schedule, train


def drafter_batch(target: DiscreteTarget, conditions: torch.Tensor, tokens: torch.Tensor, class_dropout: float,
                  gen: torch.Generator, caption_mask: torch.Tensor | None = None,
                  null: Callable | None = None) -> tuple[torch.Tensor, ...]:
    """Teacher-forced target features for one batch: ``(ids, positions, features, target_features)``.
    A dropped condition is replaced by its guidance null, seen through the slots the null attends at inference:
    ``null(conditions, caption_mask) -> (nulls, their mask)``; None: the target's ``null_condition`` under the
    condition's own mask."""
    cfg = target.config
    b = tokens.shape[0]
    drop = torch.rand(b, generator=gen) < class_dropout
    nulls, null_mask = (target.null_condition(conditions), caption_mask) if null is None else null(conditions,
                                                                                                   caption_mask)
    conditions = torch.where(drop.view(b, *[1] * (conditions.dim() - 1)), nulls, conditions)
    if caption_mask is not None:
        caption_mask = torch.where(drop[:, None], null_mask, caption_mask)
    mask = None if caption_mask is None else caption_causal_mask(caption_mask, cfg.cls_token_num + tokens.shape[1])
    with torch.no_grad():
        hidden = target.teacher_forced(conditions, tokens, mask).hidden  # [b, C + N, D]
    c = cfg.cls_token_num
    # slot p consumes the token at position p + 1 (condition slots carry the placeholder id 0)
    ids = torch.cat([torch.zeros(b, c - 1, dtype=torch.long), tokens], dim=1)[:, : c - 1 + tokens.shape[1]]
    positions = torch.arange(1, ids.shape[1] + 1).expand(b, -1)
    return ids, positions, hidden[:, :-1], hidden[:, 1:]


def drafter_loss(drafter: Drafter, head: torch.nn.Linear, ids, positions, features, targets, first_slot: int,
                 noise: float, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    noisy = features + (torch.rand(features.shape, generator=gen) - 0.5) * noise
    pred = drafter(noisy, ids, positions, causal_mask(ids.shape[1])).hidden
    pred, targets = pred[:, first_slot:], targets[:, first_slot:]
    regression = F.smooth_l1_loss(pred, targets)
    with torch.no_grad():
        teacher = torch.softmax(head(targets), dim=-1)
    student = torch.log_softmax(head(pred), dim=-1)
    distribution = -(teacher * student).sum(-1).mean()
    agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
    return regression + 0.1 * distribution, {"regression": regression.item(), "top1_agreement": agree.item()}


def train_drafter(target: DiscreteTarget, conditions: torch.Tensor, tokens: torch.Tensor, out_dir: Path, seed: int,
                  steps: int = 1500, batch: int = 16, lr: float = 1e-3, class_dropout: float = 0.1,
                  config: DrafterConfig | None = None, caption_mask: torch.Tensor | None = None,
                  null: Callable | None = None) -> Drafter:
    """``conditions [M]`` class ids, or ``[M, C, ...]`` left-padded captions or prompt ids with
    ``caption_mask [M, C]``; ``tokens [M, N]`` the images' stream tokens; ``null``: see :func:`drafter_batch`."""
    target.eval().requires_grad_(False)
    torch.manual_seed(seed)
    drafter = Drafter(config or DrafterConfig.for_target(target.config), target.config)
    drafter.embed_tokens.weight.data.copy_(target.embedding_table().detach())  # EAGLE: the target's embedding
    noise = 0.2 * 512 / (target.config.cls_token_num + tokens.shape[1])  # LANTERN's feature-noise amplitude
    first_slot = target.config.cls_token_num - 1

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(tokens), (batch,), generator=gen)
        masks = None if caption_mask is None else caption_mask[pick]
        ids, pos, feats, goals = drafter_batch(target, conditions[pick], tokens[pick], class_dropout, gen, masks, null)
        return drafter_loss(drafter, target.head, ids, pos, feats, goals, first_slot, noise, gen)

    train("drafter", drafter, step_fn, Schedule(steps=steps, lr=lr, warmup=min(100, steps // 10)), out_dir, seed)
    return drafter.eval()
