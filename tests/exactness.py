"""A joint goodness-of-fit test for samplers that claim to draw exactly from the target.

Each token of a generated image is mapped through its own conditional distribution under the target, given the
image's earlier tokens (teacher forcing, with the same guidance and filters): ``U = F(x - 1) + V·p(x)`` with ``F``
the conditional's CDF and ``V`` a fresh uniform (the randomised probability integral transform). When every token
is drawn from that conditional, all the ``U`` of all positions of all images are independent and uniform on
[0, 1) — the chain rule makes this a statement about whole images, not per-position marginals — so one
Kolmogorov-Smirnov test over them sees errors that show only jointly (a draw that depends on an earlier
acceptance's uniform, a residual left unnormalised, an acceptance against the wrong power of p)."""
from __future__ import annotations

import torch
from scipy import stats

from vvs.runtime.sampling import Processor, cfg_matrix, mix, vocabulary_mask


def conditionals(pipe, conditions: torch.Tensor, tokens: torch.Tensor, cfg_scale: float, temperature: float,
                 top_k: int = 0, top_p: float = 1.0, slots: torch.Tensor | None = None) -> torch.Tensor:
    """``[n, N, V]``: the target's processed distribution of every token given the image's earlier tokens.
    ``slots``: the conditions' slot mask ``[n, C]`` where they are padded; the guidance nulls then come from the
    folder's conditioning, with the slots they attend. Ids the model never samples have no mass; a family's forced
    tokens are one-hot where it forces them.

    On the torch backend the target module is teacher-forced, independently of the graphs; on another backend (an
    engine folder on ONNX Runtime, e.g. an int4 one) the folder's own ``target_prefill`` and ``target_verify``
    graphs score the whole prefix in one call each (:func:`graph_logits`): the target those graphs compute is the
    one the exact modes must sample."""
    from vvs.models.layers import caption_causal_mask

    verify = pipe.engines.graphs["target_verify"]
    if not hasattr(verify, "module"):
        return _processed(pipe, graph_logits(pipe.engines, conditions, tokens, cfg_scale, slots), tokens, temperature,
                          top_k, top_p)
    target = verify.module.target
    n = len(tokens)
    prefix = tokens[:, :-1]
    guided = cfg_scale > 1
    if slots is None:
        rows, mask = (torch.cat([conditions, target.null_condition(conditions)]) if guided else conditions), None
    else:
        rows, row_slots = conditions, slots
        if guided:
            nulls, null_slots = pipe.engines.conditioning.null(pipe.engines, conditions, slots)
            rows, row_slots = torch.cat([conditions, nulls]), torch.cat([slots, null_slots])
        seen = torch.cat([row_slots, torch.ones(len(rows), prefix.shape[1], dtype=torch.bool)], 1)
        mask = caption_causal_mask(seen, seen.shape[1])
    with torch.no_grad():
        out = target.teacher_forced(rows, prefix.repeat(rows.shape[0] // n, 1), mask)
    logits = out.logits[:, target.config.cls_token_num - 1:]  # output position C - 1 + i predicts token i
    never = vocabulary_mask(target.config.vocab_size, target.config.sampled_ids)  # e.g. an end-of-line token
    mixed = mix(cfg_matrix(n, cfg_scale), logits)
    return _processed(pipe, mixed if never is None else never(mixed), tokens, temperature, top_k, top_p)


def graph_logits(engines, conditions: torch.Tensor, tokens: torch.Tensor, cfg_scale: float,
                 slots: torch.Tensor | None = None) -> torch.Tensor:
    """``[n, N, V]`` guided logits of every token given the image's earlier tokens, from an engine set's target
    graphs as the runtime calls them: ``target_prefill`` over the condition rows (guidance nulls from the set's
    conditioning) for token 0, then ``target_verify`` over tokens ``0 .. N-2`` at positions ``C + i`` against the
    prefill's keys/values, causal among themselves. The graphs mix guidance and mask never-sampled ids."""
    from vvs.models.layers import caption_causal_mask

    n, N = tokens.shape
    C = engines.target.cls_token_num
    dev = engines.device
    cfg_mix = cfg_matrix(n, cfg_scale, device=dev)
    conditions = conditions.to(dev, engines.dtype if conditions.is_floating_point() else conditions.dtype)
    rows, row_slots = conditions, slots
    if cfg_scale > 1:
        nulls, null_slots = engines.conditioning.null(engines, conditions, slots)
        rows = torch.cat([conditions, nulls])
        row_slots = None if slots is None else torch.cat([slots, null_slots])
    if row_slots is None:
        row_slots = torch.ones(len(rows), C, dtype=torch.bool)
    mask = caption_causal_mask(row_slots.to(dev), C + N - 1)  # [rows, 1, C + N - 1, C + N - 1]
    first = engines.graphs["target_prefill"].run(condition=rows, attn_mask=mask[:, :, :C, :C].contiguous(),
                                                 cfg_mix=cfg_mix)
    groups = len(rows) // n
    prefix = tokens[:, :-1].to(dev).repeat(groups, 1)
    positions = (C + torch.arange(N - 1, device=dev)).expand(len(rows), -1).contiguous()
    rest = engines.graphs["target_verify"].run(input_ids=prefix, position_ids=positions,
                                               attn_mask=mask[:, :, C:].contiguous(), past_kv=first["new_kv"],
                                               cfg_mix=cfg_mix)
    return torch.cat([first["logits"][:, None], rest["logits"]], 1).float().cpu()


def _processed(pipe, logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int,
               top_p: float) -> torch.Tensor:
    """The sampling filters over guided logits ``[n, N, V]``, and the family's forced tokens made one-hot."""
    probs = Processor(temperature, top_k, top_p).probs(logits)
    layout = pipe.engines.token_layout
    if layout is not None:
        forced = torch.tensor(layout.forced[: tokens.shape[1]])
        onehot = torch.nn.functional.one_hot(forced.clamp(min=0), probs.shape[-1]).to(probs.dtype)
        probs = torch.where((forced >= 0)[None, :, None], onehot, probs)
    return probs


def pit_pvalues(probs: torch.Tensor, tokens: torch.Tensor, seed: int = 0) -> tuple[float, float]:
    """KS p-values of the randomised PIT values of ``tokens [n, N]`` under ``probs [n, N, V]``: all positions
    jointly, and the worst single position (Bonferroni-adjusted over the N positions), each the smaller of two
    orderings of the codes (Bonferroni-adjusted over the two): by index, and by descending probability. Any
    ordering that is a function of the prefix keeps the values uniform under an exact sampler; the second turns a
    sampler that moves mass between likely and unlikely codes (an acceptance against p^0.9) into a shift of the
    values towards one end, which the index order scatters and hides."""
    by_index = _pit(probs, tokens, seed)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties by index: a function of the prefix
    by_probability = _pit(ordered, order.argsort(-1).gather(-1, tokens[..., None]).squeeze(-1), seed)
    return tuple(min(1.0, 2 * min(a, b)) for a, b in zip(by_index, by_probability))


def _pit(probs: torch.Tensor, tokens: torch.Tensor, seed: int) -> tuple[float, float]:
    px = probs.gather(-1, tokens[..., None]).squeeze(-1)
    below = probs.cumsum(-1).gather(-1, tokens[..., None]).squeeze(-1) - px
    v = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(seed), dtype=probs.dtype)
    u = (below + v * px).clamp(0, 1).double().numpy()
    joint = stats.kstest(u.reshape(-1), "uniform").pvalue
    worst = min(stats.kstest(u[:, pos], "uniform").pvalue for pos in range(u.shape[1])) * u.shape[1]
    return float(joint), float(min(worst, 1.0))
