"""The MoE routing gap of a fixture model: how close each router's top-k choice came to picking
another expert (a near-tie would make the parity tests flaky)."""

from __future__ import annotations

import numpy as np
import torch
from hf_runs import full_logits

MIN_MARGIN = 1e-4  # smallest allowed top-k routing gap (see _router_margin)


def _router_margin(router: torch.nn.Module, logits: torch.Tensor) -> float:
    """Smallest gap, over tokens, between the last chosen and the first rejected candidate.

    A tiny gap means a float32 port could legitimately pick other experts, so the fixture would
    make parity tests flaky. Softmax routers: gap in probability at rank top_k. NemotronH's
    sigmoid router: the min of the group-choice gap and the in-group expert-choice gap.
    """
    k = router.top_k
    if not hasattr(router, "e_score_correction_bias"):
        probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        return float((probs[:, k - 1] - probs[:, k]).min())
    choice = logits.float().sigmoid() + router.e_score_correction_bias
    grouped = choice.view(choice.shape[0], router.num_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
    g = router.topk_group
    gap = float("inf")
    if g < router.num_group:
        gap = float((group_scores[:, g - 1] - group_scores[:, g]).min())
    keep = grouped.sum(-1).new_zeros(grouped.shape[:2], dtype=torch.bool)
    keep.scatter_(1, grouped.topk(2, dim=-1).values.sum(-1).topk(g, dim=-1).indices, True)
    masked = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(1)
    ranked = masked.sort(dim=-1, descending=True).values
    return min(gap, float((ranked[:, k - 1] - ranked[:, k]).min()))


def routing_margin(model: torch.nn.Module, seqs: list[np.ndarray]) -> float:
    """Smallest top-k selection gap of every MoE router over full forwards of seqs (inf if none)."""
    routers = [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]
    margins: list[float] = []
    hooks = [
        r.register_forward_hook(lambda mod, _inp, out: margins.append(_router_margin(mod, out[0])))
        for r in routers
    ]
    for seq in seqs:
        full_logits(model, seq)
    for h in hooks:
        h.remove()
    return min(margins, default=float("inf"))
