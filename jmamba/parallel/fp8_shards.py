"""FP8 kernels split over tensor parallelism: the rule of an `Fp8Linear`'s scale from its
kernel's, and the FP8 plan of one shard (`jmamba.sharding.shard_config`).

A kernel [in, out] that a rule splits along one axis takes, on each shard, runs of whole entries
(`ShardRule.spans`); its scales along that axis (one per `side` entries, the block's side there)
split the same way in runs of blocks: side 0 (one scale along the axis) leaves the scale whole on
every shard, side 1 (per channel) splits it as the kernel, a larger side splits it run for run
when every run starts and ends on a block boundary (a segment's unit a multiple of the side, or
each shard's share of the segment). Where a run would cut a block the shard's kernel is
dequantized instead, and the shard's plan says why. FP8 expert stacks are dequantized under
tensor parallelism (their scales' rules are not written yet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jmamba.fp8_plan import Fp8Plan, Path_
from jmamba.parallel.rules import REPLICATED, Segment, ShardRule

_STACKS = ("gate_proj", "up_proj", "down_proj")  # a MoE's expert stacks
EXPERTS_REASON = "an FP8 expert stack read shard by shard (its scales' split is not written)"


def _scale_segment(segment: Segment, side: int, shards: int) -> Segment | None:
    """The segment of the scales of `segment`'s entries in blocks of `side` (> 1), or None where
    a shard's run of entries would cut a block."""
    if segment.unit_size % side == 0:
        return dataclasses.replace(segment, unit_size=segment.unit_size // side)
    if segment.replicable or segment.padded or segment.units % shards:
        return None
    share = segment.units // shards * segment.unit_size  # entries of one shard's run
    if share % side:
        return None
    return Segment(segment.field, shards, share // side)


def scale_rule(rule: ShardRule, side: int, shards: int) -> ShardRule | None:
    """How the scales of a kernel split by `rule` over `shards` shards split, with `side`
    entries per scale along the rule's axis; None where a shard would cut a block."""
    if not rule.segments or side == 0:
        return REPLICATED
    if side == 1:
        return rule
    segments = [_scale_segment(segment, side, shards) for segment in rule.segments]
    if any(segment is None for segment in segments):
        return None
    return ShardRule(rule.axis, tuple(s for s in segments if s is not None))


def _cut_reason(shards: int, side: int) -> str:
    return f"a split over {shards} tensor-parallel shards cuts its scale blocks of {side} entries"


def shard_plan(plan: Fp8Plan, rules: Mapping[Path_, ShardRule], shards: int) -> Fp8Plan:
    """The plan of one of `shards` shards of a model whose parameters split by `rules`: the
    layers whose scales split with their kernels; the others, and the expert stacks, dequantized
    with their reasons. The plan itself for one shard."""
    if shards == 1 or not (plan.layers or plan.experts):
        return plan
    kept, dropped = [], []
    for layer, block in plan.layers:
        rule = rules.get((*layer, "kernel"), REPLICATED)
        if scale_rule(rule, block[rule.axis], shards) is None:
            dropped.append(((*layer, "kernel"), _cut_reason(shards, block[rule.axis])))
        else:
            kept.append((layer, block))
    stacks = [(*moe, s) for moe, _ in plan.experts for s in _STACKS if (*moe, s) in rules]
    dropped += [(stack, EXPERTS_REASON) for stack in stacks]
    return dataclasses.replace(
        plan, layers=tuple(kept), experts=(), dequantized=(*plan.dequantized, *dropped)
    )


def scale_rules(
    plan: Fp8Plan, rules: Mapping[Path_, ShardRule], shards: int
) -> dict[Path_, ShardRule]:
    """The rule of the scale of each layer `shard_plan` keeps in FP8 (over one shard: those
    whose rule has one)."""
    out = {}
    for layer, block in shard_plan(plan, rules, shards).layers:
        rule = rules.get((*layer, "kernel"), REPLICATED)
        scaled = scale_rule(rule, block[rule.axis], shards)
        if scaled is not None:
            out[(*layer, "scale")] = scaled
    return out
