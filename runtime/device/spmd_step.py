"""The step as a pure function: one device's step on its own shards (`_rank_step`) and the same
step over every device of the mesh (`spmd_step`, one `jax.shard_map`): parameters split over
`tp`, caches over `dp` (pool axis) and `tp` (head axis), the packed inputs and every output split
over `dp` and the same on each `tp` shard of a rank. `ModelRunner` jits and compiles it per
variant.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from jmamba.inputs import StepInputs
from jmamba.layers import invariance
from jmamba.model import rows_or_zeros
from jmamba.tensor_parallel import TP_AXIS
from runtime.core.sampling_inputs import SamplingMode, TokenLogprobs
from runtime.device.distributed import AXIS, DeviceMesh
from runtime.device.mtp_drafts import DeviceDrafter
from runtime.device.packing import Layout, unpack
from runtime.device.sampler import accept_drafts, fed_tokens, logprobs, sample
from runtime.device.step_buffers import StepOutputs


def _rank_step(
    graphdef,
    param_treedef,
    keep_logits: bool,
    batch_invariant: bool,
    layout: Layout,
    mode: SamplingMode,
    drafter: DeviceDrafter,
    param_leaves,
    caches,
    packed,
    previous,
):
    """One device's step on its own shard: its parameters ([1, ...] each), packed [1, words] and
    what the previous step carried [1, 1 + D, C] -> [1, 2, N] (tokens, accept flags),
    log-probabilities (when `mode.logprobs`), logits (when `keep_logits`), the drafts for the
    next step [1, 1 + k, N] (when `drafter` drafts; `runtime.device.mtp_drafts`), caches, what
    this step carries to the next [1, 1 + D, C] (`_carried`). The packed tree is (inputs,
    sampling, token sources, what follows each prefill chunk), the last two None where the step
    does not read them (`packed_tree`).
    `batch_invariant`: the model's products and norm statistics run in an order fixed by static
    shapes (`jmamba.layers.invariance`)."""
    inputs, sampling, sources, following = unpack(packed[0], layout)
    if previous is not None:
        inputs = _with_previous_tokens(inputs, sources, previous[0].reshape(-1))
    shard_params = [leaf[0] for leaf in param_leaves]
    model = nnx.merge(graphdef, jax.tree.unflatten(param_treedef, shard_params))
    with invariance.batch_invariant(batch_invariant):
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
    tokens_and_flags = jnp.stack([tokens, accepted])[None]
    carried = None if previous is None else _carried(tokens, drafts, previous.shape[1:])[None]
    logits_out = logits[None] if keep_logits else None
    drafts_out = None if drafts is None else drafts[None]
    return tokens_and_flags, token_logprobs, logits_out, drafts_out, caches, carried


def _carried(tokens: jax.Array, drafts: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """What this step hands the next, [1 + D, C]: row 0 its sampled token of each logits row,
    rows 1..D the drafts its device drafter made at each row's column (zeros without drafts;
    `runtime.device.mtp_drafts`). A draft model's wider buckets feed nothing past C."""
    depth, width = shape
    n = min(tokens.shape[0], width)
    rows = [tokens[:n]]
    for j in range(1, depth):
        made = drafts is not None and j < drafts.shape[0]
        rows.append(drafts[j, :n] if made else jnp.zeros(n, tokens.dtype))
    return jnp.pad(jnp.stack(rows), ((0, 0), (0, width - n)))


def _with_previous_tokens(
    inputs: StepInputs, sources: jax.Array, previous: jax.Array
) -> StepInputs:
    """Token lanes with a source s + 1 take entry s of the previous step's carried array,
    flattened (the builder's `StepBatch.token_sources`): row 0 (s < C) its sampled tokens, row
    j its j-th drafts; NULL sources keep their token id."""
    taken = previous[jnp.maximum(sources - 1, 0)]
    return dataclasses.replace(inputs, token_ids=jnp.where(sources > 0, taken, inputs.token_ids))


def spmd_step(
    mesh: DeviceMesh,
    cache_specs,
    graphdef,
    param_treedef,
    keep_logits: bool,
    batch_invariant: bool,
    layout: Layout,
    mode: SamplingMode,
    drafter: DeviceDrafter,
    param_leaves,
    caches,
    packed,
    outputs,
    carried,
):
    """The step over all devices: -> (caches, StepOutputs, carried). `cache_specs`: each cache
    array's `PartitionSpec`. `outputs` (the variant's buffers, or None when only shapes are asked
    for) is never read: donated, it gives the new outputs their addresses
    (`runtime.device.step_buffers`)."""
    del outputs
    by_rank = P(AXIS)
    param_specs = [P(TP_AXIS)] * len(param_leaves)
    step = functools.partial(
        _rank_step, graphdef, param_treedef, keep_logits, batch_invariant, layout, mode, drafter
    )
    logprob_specs = TokenLogprobs(by_rank, by_rank, by_rank) if mode.logprobs else None
    tokens, token_logprobs, logits, drafts, caches, carried = jax.shard_map(
        step,
        mesh=mesh.mesh,
        in_specs=(param_specs, cache_specs, by_rank, None if carried is None else by_rank),
        out_specs=(
            by_rank,
            logprob_specs,
            by_rank if keep_logits else None,
            by_rank if drafter.num_drafts else None,
            cache_specs,
            None if carried is None else by_rank,
        ),
        check_vma=False,  # Pallas calls declare plain output shapes
    )(param_leaves, caches, packed, carried)
    return caches, StepOutputs(tokens, token_logprobs, logits, drafts), carried
