"""The step as a pure function: one device's step on its own shards (`_rank_step`) and the same
step over every device of the mesh (`spmd_step`, one `jax.shard_map`): parameters split over
`tp`, caches over `dp` (pool axis) and `tp` (head axis), the packed inputs and every output split
over `dp` and the same on each `tp` shard of a rank. `ModelRunner` jits and compiles it per
variant, each variant's static choices named in one `StepSpec`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.extend.core import jaxpr_as_fun
from jax.sharding import PartitionSpec as P

from jmamba.layers import invariance
from jmamba.model import rows_or_zeros
from jmamba.parallel.collectives import TP_AXIS
from runtime.core.sampling_inputs import SamplingMode, TokenLogprobs
from runtime.device.chaining import carried, follow, rejected_drafts
from runtime.device.distributed import AXIS, DeviceMesh
from runtime.device.mtp_drafts import DeviceDrafter
from runtime.device.packing import Layout, unpack
from runtime.device.sampler import accept_drafts, fed_tokens, logprobs, sample
from runtime.device.step_buffers import StepOutputs


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What a compiled step is specialised on beyond its argument shapes (hashable: the jitted
    step's one static argument).

    Attributes:
      graphdef / param_treedef: the shard model's structure and its parameters' tree.
      block_size: tokens per KV block (rows moved back recompute their KV slots).
      keep_logits: the step returns its fp32 logits too.
      batch_invariant: the model's products and norm statistics run in an order fixed by static
        shapes (`jmamba.layers.invariance`).
      layout: where each input sits in the packed row (`runtime.device.packing`).
      mode: the sampler's mode.
      drafter: what drafts for the next step on the device (`runtime.device.mtp_drafts`).
      steps: the steps one call runs (`_rank_chain`; 1: the plain step).
    """

    graphdef: Any
    param_treedef: Any
    block_size: int
    keep_logits: bool
    batch_invariant: bool
    layout: Layout
    mode: SamplingMode
    drafter: DeviceDrafter
    steps: int = 1


def _rank_chain(spec: StepSpec, param_leaves, caches, packed, previous):
    """`spec.steps` steps of one device in one program (multi-step decode): packed [1, S x
    words] holds each step's packed row in turn, and each step takes over from the one before
    through what it carries, as the first takes over from the previous program
    (`runtime.device.chaining`). Returns `_rank_step`'s outputs, each with a step axis after
    the rank's ([1, S, ...]), the caches, and what the last step carries."""
    parts = packed.reshape(spec.steps, 1, -1)

    def one_step(carry, part):
        caches, previous = carry
        tokens, logprobs, logits, caches, carried = _rank_step(
            spec, param_leaves, caches, part, previous
        )
        return (caches, carried), (tokens, logprobs, logits)

    (caches, carried), outputs = jax.lax.scan(one_step, (caches, previous), parts)
    tokens, logprobs, logits = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), outputs)
    return tokens, logprobs, logits, caches, carried


def _rank_step(spec: StepSpec, param_leaves, caches, packed, previous):
    """One device's step on its own shard: its parameters ([1, ...] each), packed [1, words] and
    what the previous step carried [1, depth, C] -> [1, 2 (+ 1 + k), N] (tokens, accept flags,
    then the drafts for the next step when `spec.drafter` drafts: `runtime.device.mtp_drafts`),
    log-probabilities (when `spec.mode.logprobs`), logits (when `spec.keep_logits`), caches,
    what this step carries to the next [1, depth, C] (`runtime.device.chaining`). The packed tree
    is (inputs, sampling, (token sources, chained rows), what follows each prefill chunk), the
    last None where the step does not read it and chained rows None without a head
    (`ModelRunner._packed_tree`). A step whose token sources are all NULL (a synchronous
    engine's) takes nothing from `previous`."""
    mode, drafter = spec.mode, spec.drafter
    inputs, sampling, (token_sources, chained), following = unpack(packed[0], spec.layout)
    inputs, sampling = follow(
        inputs, sampling, token_sources, chained, previous[0], spec.block_size
    )
    shard_params = [leaf[0] for leaf in param_leaves]
    model = nnx.merge(spec.graphdef, jax.tree.unflatten(spec.param_treedef, shard_params))
    with invariance.batch_invariant(spec.batch_invariant):
        x, caches = model.hidden_states(inputs, caches)
        with jax.named_scope("lm_head"):
            logits = model.logits(rows_or_zeros(x, inputs.logits_indices))
        with jax.named_scope("sampler"):
            tokens = sample(logits, sampling, mode, fed_tokens(inputs))
            token_logprobs = None
            if mode.logprobs:
                computed = logprobs(logits, tokens, mode.top_logprobs)
                token_logprobs = jax.tree.map(lambda a: a[None], computed)
            accepted = accept_drafts(tokens, inputs).astype(jnp.int32)
        with jax.named_scope("drafter"):
            drafts, caches = drafter(model, x, tokens, accepted, inputs, following, caches)
    tokens_and_flags = jnp.stack([tokens, accepted])
    if drafts is not None:  # one array for the host to fetch (`StepOutputs.tokens`)
        tokens_and_flags = jnp.concatenate([tokens_and_flags, drafts])
    rejected = None if chained is None else rejected_drafts(accepted, inputs)
    carried_out = carried(tokens, drafts, rejected, previous.shape[1:])[None]
    logits_out = logits[None] if spec.keep_logits else None
    return tokens_and_flags[None], token_logprobs, logits_out, caches, carried_out


def spmd_step(
    mesh: DeviceMesh,
    cache_specs,
    spec: StepSpec,
    param_leaves,
    caches,
    packed,
    carried,
):
    """The step over all devices: -> (caches, StepOutputs, carried). `cache_specs`: each cache
    array's `PartitionSpec`. Traced once per variant, then compiled with its output buffers
    (`with_output_buffers`)."""
    by_rank = P(AXIS)
    param_specs = [P(TP_AXIS)] * len(param_leaves)
    step = functools.partial(_rank_step if spec.steps == 1 else _rank_chain, spec)
    logprob_specs = TokenLogprobs(by_rank, by_rank, by_rank) if spec.mode.logprobs else None
    tokens, token_logprobs, logits, caches, carried = jax.shard_map(
        step,
        mesh=mesh.mesh,
        in_specs=(param_specs, cache_specs, by_rank, by_rank),
        out_specs=(
            by_rank,
            logprob_specs,
            by_rank if spec.keep_logits else None,
            cache_specs,
            by_rank,
        ),
        check_vma=False,  # Pallas calls declare plain output shapes
    )(param_leaves, caches, packed, carried)
    return caches, StepOutputs(tokens, token_logprobs, logits), carried


def with_output_buffers(traced: jax.stages.Traced) -> jax.stages.Wrapped:
    """A traced variant of `spmd_step` as a jitted function of (param_leaves, caches, packed,
    outputs, carried) whose `outputs`, the variant's output buffers, are never read: donated,
    they give the new outputs their addresses (`runtime.device.step_buffers`). Its body replays
    the traced jaxpr, so a variant is traced once, though its output buffers are made from the
    shapes the trace gave (tracing it a second time for them made lowering a tiny MTP model's
    variant 0.13 s, or 16%, slower)."""
    run = jaxpr_as_fun(traced.jaxpr)

    def spmd_step_with_outputs(param_leaves, caches, packed, outputs, carried):
        del outputs
        results = run(*jax.tree.leaves((param_leaves, caches, packed, carried)))
        return jax.tree.unflatten(traced.out_tree, results)

    return jax.jit(
        spmd_step_with_outputs,
        donate_argnames=("caches", "outputs", "carried"),
        keep_unused=True,  # `outputs` is only donated: pruned, it would give no addresses
    )
