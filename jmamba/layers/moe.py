"""Mixture of experts: a router choosing top-k experts per token, the experts, a shared expert.

The routed experts run as grouped matmuls over the (token, choice) pairs sorted by expert
(`ops.grouped_matmul`, the semantics of `jax.lax.ragged_dot`; on the GPU a Pallas kernel that reads
only the experts that have pairs, where XLA's ragged_dot reads all of them): each token reaches
only its top-k experts' weights (Qwen3-Next routes 10 of 512); fp32 operands get full-precision
fp32 dots; an FP8 checkpoint's stacks may stay e4m3 with their block scales
(`jmamba.layers.fp8_experts`: `ops.fp8_grouped_matmul` on the GPU). The per-choice outputs are put
back in token order and summed over the k choices (a gather, not a scatter-add, so the sum is
deterministic; under `batch_invariant()` the router's softmax and every sum over experts or
choices also run in an order fixed by their sizes).

Expert parallelism: each tensor-parallel shard holds `num_experts / T` experts and the whole
router. Every shard routes every token (the same choices on each), then runs the grouped matmuls
over the (token, choice) pairs of its own experts only; the pairs of other shards' experts sort
past the last group, whose rows the grouped matmul leaves zero. Its partial sum, plus its share of
the column- then row-parallel shared expert, reaches the other shards in the layer's one
all-reduce (`jmamba.model.Layer`): tokens never move between shards, each shard reads all of them
(they are replicated over tp anyway), and no all-to-all is needed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.fp8_plan import Block
from jmamba.layer_configs import MoeConfig
from jmamba.layers.fp8_experts import fp8_expert_product
from jmamba.layers.fp32_param import Fp32Param
from jmamba.layers.invariance import is_batch_invariant
from jmamba.layers.linear import Linear
from jmamba.layers.matmul import matmul
from jmamba.layers.mlp import MLP, mlp_tp_rules, relu2
from jmamba.parallel.collectives import WHOLE, TensorParallel
from jmamba.parallel.rules import REPLICATED, Segment, ShardRule, split
from pallas_kernels import ops

FOLD_TERMS = 32  # sums of at most this many terms fold in order; longer ones run as a product


def _sum(x: jax.Array, axis: int = -1) -> jax.Array:
    """Sum over `axis` (kept, of size 1). Under `batch_invariant()` in an order fixed by the axis'
    size n (the terms folded in order, or for more than FOLD_TERMS the fixed-tile product with a
    column of ones), else XLA's reduction, whose order may follow the step's shape."""
    n = x.shape[axis]
    if not is_batch_invariant():
        return jnp.sum(x, axis=axis, keepdims=True)
    if n <= FOLD_TERMS:
        terms = [jax.lax.slice_in_dim(x, j, j + 1, axis=axis) for j in range(n)]
        return functools.reduce(jnp.add, terms)
    last = jnp.moveaxis(x, axis, -1)
    return jnp.moveaxis(matmul(last, jnp.ones((n, 1), x.dtype), x.dtype), -1, axis)


def _softmax(logits: jax.Array) -> jax.Array:
    """Softmax over the last axis (`jax.nn.softmax`'s arithmetic, its sum through `_sum`)."""
    e = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))
    return e / _sum(e)


def _softmax_topk(logits: jax.Array, cfg: MoeConfig) -> tuple[jax.Array, jax.Array]:
    """Qwen routing: softmax over experts, top-k, optional renormalisation."""
    weights, ids = jax.lax.top_k(_softmax(logits), cfg.top_k)
    if cfg.norm_topk_prob:
        weights = weights / _sum(weights)
    return weights, ids


def _sigmoid_grouped_topk(
    logits: jax.Array, bias: jax.Array, cfg: MoeConfig
) -> tuple[jax.Array, jax.Array]:
    """NemotronH routing: pick experts by biased sigmoid scores inside the best groups, weight them
    by the unbiased scores (renormalised), times the routed scaling factor."""
    scores = jax.nn.sigmoid(logits)
    choice = scores + bias
    grouped = choice.reshape(*choice.shape[:-1], cfg.n_group, -1)
    group_scores = jnp.sum(jax.lax.top_k(grouped, min(2, grouped.shape[-1]))[0], axis=-1)
    _, best_groups = jax.lax.top_k(group_scores, cfg.topk_group)
    group_mask = jnp.sum(jax.nn.one_hot(best_groups, cfg.n_group, dtype=jnp.bool_), axis=-2) > 0
    expert_mask = jnp.repeat(group_mask, cfg.num_experts // cfg.n_group, axis=-1)
    _, ids = jax.lax.top_k(jnp.where(expert_mask, choice, -jnp.inf), cfg.top_k)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / (_sum(weights) + 1e-20)
    return weights * cfg.routed_scaling_factor, ids


class MoE(nnx.Module):
    """Routed experts (SwiGLU or relu^2) plus a shared expert, optionally sigmoid-gated (Qwen)."""

    def __init__(self, hidden: int, cfg: MoeConfig, *, rngs: nnx.Rngs, tp: TensorParallel = WHOLE):
        self.cfg = cfg
        self.tp = tp
        i = cfg.intermediate_size
        e = Segment("moe.num_experts", cfg.num_experts).local_units(tp.size)  # this shard's experts
        self.router = Linear(hidden, cfg.num_experts, rngs=rngs, param=Fp32Param)
        if cfg.router == "sigmoid_grouped":
            self.router_bias = Fp32Param(jnp.zeros((cfg.num_experts,), jnp.float32))

        def expert_weights(shape: tuple[int, ...]) -> nnx.Param:
            fan_in = shape[1]
            return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) / fan_in**0.5)

        if cfg.activation == "silu_gated":
            self.gate_proj = expert_weights((e, hidden, i))
        self.up_proj = expert_weights((e, hidden, i))
        self.down_proj = expert_weights((e, i, hidden))
        self.fp8_block: Block | None = None  # FP8 stacks' scale block (`with_fp8_experts`)
        self.shared = MLP(hidden, cfg.shared_intermediate_size, cfg.activation, rngs=rngs)
        if cfg.shared_gate:
            self.shared_gate = Linear(hidden, 1, rngs=rngs)

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per token its top-k experts' weights [T, k] (fp32) and ids [T, k]; the router kernel
        is fp32 (`Fp32Param`), so the logits are computed in fp32 from the activations."""
        logits = self.router(x).astype(jnp.float32)
        if self.cfg.router == "softmax":
            return _softmax_topk(logits, self.cfg)
        return _sigmoid_grouped_topk(logits, self.router_bias[...], self.cfg)

    def experts(self, x: jax.Array, weights: jax.Array, ids: jax.Array) -> jax.Array:
        """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) over this shard's experts, as fp32
        [T, hidden] (every expert in a whole model)."""
        num_tokens, k = ids.shape
        # This shard's experts are global ids first .. first + local - 1.
        local = self.up_proj[...].shape[0]
        flat = ids.reshape(-1) - self.tp.index() * local
        flat = jnp.where((flat >= 0) & (flat < local), flat, local)  # others' pairs: past the end
        order = jnp.argsort(flat, stable=True)  # (token, choice) pairs grouped by expert
        group_sizes = jnp.bincount(flat, length=local).astype(jnp.int32)
        xs = x[order // k]

        def grouped(a: jax.Array, proj: str) -> jax.Array:
            return self._grouped(a, proj, group_sizes)

        up = grouped(xs, "up_proj")
        if self.cfg.activation == "silu_gated":
            act = jax.nn.silu(grouped(xs, "gate_proj")) * up
        else:
            act = relu2(up)
        out = grouped(act.astype(x.dtype), "down_proj")  # [T * k, hidden], expert order
        out = out[jnp.argsort(order)]  # back to (token, choice) order
        out = out.reshape(num_tokens, k, -1) * weights[..., None]
        return _sum(out, axis=1)[:, 0]  # over the k choices

    def _grouped(self, rows: jax.Array, proj: str, group_sizes: jax.Array) -> jax.Array:
        """fp32 rows grouped by expert times this shard's stack `proj` (an FP8 one's product:
        `fp8_expert_product`)."""
        kernel = getattr(self, proj)[...]
        if self.fp8_block is None:
            return ops.grouped_matmul(rows, kernel, group_sizes, out_dtype=jnp.float32)
        scale = getattr(self, f"{proj}_scale")[...]
        return fp8_expert_product(rows, kernel, scale, group_sizes, self.fp8_block)

    def __call__(self, x: jax.Array) -> jax.Array:
        routed = self.experts(x, *self.route(x))
        shared = self.shared(x).astype(jnp.float32)
        if self.cfg.shared_gate:
            shared = jax.nn.sigmoid(self.shared_gate(x).astype(jnp.float32)) * shared
        return (routed + shared).astype(x.dtype)


def moe_tp_rules(cfg: MoeConfig) -> dict[tuple[str, ...], ShardRule]:
    """Experts over tp (expert parallelism), the router whole, the shared expert as an MLP
    (column- then row-parallel), its gate whole."""
    experts = split(0, Segment("moe.num_experts", cfg.num_experts))
    gated = cfg.activation == "silu_gated"
    rules = {("router", "kernel"): REPLICATED, ("up_proj",): experts, ("down_proj",): experts}
    if gated:
        rules[("gate_proj",)] = experts
    if cfg.router == "sigmoid_grouped":
        rules[("router_bias",)] = REPLICATED
    if cfg.shared_gate:
        rules[("shared_gate", "kernel")] = REPLICATED
    shared = mlp_tp_rules("moe.shared_intermediate_size", cfg.shared_intermediate_size, gated)
    return rules | {("shared", *path): rule for path, rule in shared.items()}
