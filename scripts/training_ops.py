"""Batched-training stand-ins for three ops of the model, used only by `train_preset.py`.

The library's CPU references are written for serving: `ssd_chunk_scan_reference` runs one
`lax.scan` step per token, `causal_conv1d_prefill_reference` gathers each tap of each token, and
`paged_attention_reference` gathers a full row of keys for every query (its gradient is a
scatter-add of all of them). All are differentiable, but training through them was 2.5x slower
(3.1 s against 1.3 s per step of 16 x 256 tokens for the `stdlib` preset on 2 busy CPU cores).
Training only ever runs one prefill row from position 0 with fresh caches (the batch is a `vmap`
over such rows), and for that case the ops have cheap closed forms:

* SSD: the chunked matrix form of the same recurrence (within a chunk
  y_t = sum_{s<=t} exp(sum_{s<r<=t} dt_r A) dt_s (C_t . B_s) x_s, plus the state carried in from
  earlier chunks, plus D x_t);
* causal conv: shifted slices of the zero-padded input;
* attention: one gather of the row's blocks, then dense causal attention over them.

None of them writes the state pools (training never reads them back). `fast_training_ops()` swaps
them into `pallas_kernels.ops` for the duration of a `with` block; `train_preset.py` enters it only
while tracing its training step, checks loss and gradients against the library references before
training, and evaluates the final model with the references alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from pallas_kernels import ops
from pallas_kernels._common import process_dt
from pallas_kernels.rows import Rows


def one_row_ssd_scan(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    rows: Rows,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = 256,
    algorithm: str = "sequential",
) -> tuple[jax.Array, jax.Array]:
    """`ssd_chunk_scan` for one row from a zero state, in chunked matrix form; the pool is
    returned unchanged. T must be a multiple of `chunk_size` (or smaller than it). `algorithm`
    (which GPU kernel the library runs) does not change the result."""
    _check_one_row(rows)
    if z is not None:
        raise ValueError("training SSD takes no z (the Mamba2 mixer gates in its norm)")
    num_tokens, heads, head_dim = x.shape
    q = min(chunk_size, num_tokens)
    if num_tokens % q:
        raise ValueError(f"training SSD needs T={num_tokens} to be a multiple of chunk {q}")
    nc, rep = num_tokens // q, heads // B.shape[1]
    f32 = jnp.float32
    chunks = lambda a: a.reshape(nc, q, *a.shape[1:])  # noqa: E731
    xc = chunks(x.astype(f32))  # [c, Q, H, P]
    bc = chunks(jnp.repeat(B.astype(f32), rep, axis=1))  # [c, Q, H, N]
    cc = chunks(jnp.repeat(C.astype(f32), rep, axis=1))
    dtc = chunks(process_dt(dt, dt_bias, dt_softplus, dt_limit))  # [c, Q, H]
    log_decay = jnp.cumsum(dtc * A.astype(f32), axis=1)  # within each chunk, [c, Q, H]
    # 1. Inside each chunk: y_t = sum_{s<=t} exp(ld_t - ld_s) dt_s (C_t . B_s) x_s.
    within = jnp.tril(jnp.ones((q, q), bool))[None, :, :, None]
    segment = log_decay[:, :, None, :] - log_decay[:, None, :, :]  # [c, t, s, H]
    scores = jnp.einsum("cthn,cshn->ctsh", cc, bc) * jnp.exp(jnp.where(within, segment, -jnp.inf))
    y = jnp.einsum("ctsh,cshp->cthp", scores * dtc[:, None, :, :], xc)
    # 2. The state each chunk adds, as of its last token.
    to_end = jnp.exp(log_decay[:, -1:, :] - log_decay) * dtc  # [c, Q, H]
    added = jnp.einsum("csh,cshp,cshn->chpn", to_end, xc, bc)
    # 3. The state entering chunk c: sum over earlier chunks k of their added state, decayed
    #    over chunks k+1..c-1.
    total = jnp.cumsum(log_decay[:, -1, :], axis=0)  # [c, H] decay up to each chunk's end
    entering = total - log_decay[:, -1, :]  # decay up to each chunk's start
    earlier = jnp.tril(jnp.ones((nc, nc), bool), -1)[:, :, None]
    carry = jnp.exp(jnp.where(earlier, entering[:, None, :] - total[None, :, :], -jnp.inf))
    state_in = jnp.einsum("ckh,khpn->chpn", carry, added)
    # 4. What the entering state contributes to each token, plus the D skip.
    y = y + jnp.einsum("cthn,chpn,cth->cthp", cc, state_in, jnp.exp(log_decay))
    y = y.reshape(num_tokens, heads, head_dim)
    if D is not None:
        y = y + D.astype(f32)[None, :, None] * x.astype(f32)
    return _live_only(y, rows).astype(x.dtype), ssm_state


def one_row_causal_conv1d(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    conv_state: jax.Array,
    rows: Rows,
    *,
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """`causal_conv1d_prefill` for one row from a zero window (shifted slices, no gathers); the
    conv state pool is returned unchanged."""
    _check_one_row(rows)
    num_tokens, width = x.shape[0], weight.shape[1]
    padded = jnp.pad(x.astype(jnp.float32), ((width - 1, 0), (0, 0)))
    acc = sum(padded[j : j + num_tokens] * weight[:, j].astype(jnp.float32) for j in range(width))
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    if activation == "silu":
        acc = jax.nn.silu(acc)
    return _live_only(acc, rows).astype(x.dtype), conv_state


def one_row_paged_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_table: jax.Array,
    token_rows: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """`paged_attention` when every token belongs to the single row of `block_table`."""
    if block_table.shape[0] != 1:
        raise ValueError(f"training attention takes one row; block_table is {block_table.shape}")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys = k_cache[block_table[0]].reshape(-1, num_kv_heads, head_dim).astype(jnp.float32)
    values = v_cache[block_table[0]].reshape(-1, num_kv_heads, head_dim).astype(jnp.float32)
    mask = (jnp.arange(keys.shape[0])[None, :] <= positions[:, None]) & valid[:, None]
    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, -1, head_dim)
    scores = jnp.einsum("tkgd,ckd->tkgc", qg, keys) * scale
    probs = jax.nn.softmax(jnp.where(mask[:, None, None, :], scores, -1e30), axis=-1)
    out = jnp.einsum("tkgc,ckd->tkgd", probs, values).reshape(num_tokens, num_heads, head_dim)
    return jnp.where(valid[:, None, None], out, 0.0).astype(q.dtype)


def _check_one_row(rows: Rows) -> None:
    if rows.query_start_loc.shape != (2,):
        raise ValueError(
            "training ops take one prefill row; query_start_loc has shape "
            f"{rows.query_start_loc.shape}"
        )


def _live_only(y: jax.Array, rows: Rows) -> jax.Array:
    live = jnp.arange(y.shape[0]) < rows.query_start_loc[1]
    return jnp.where(live.reshape(-1, *([1] * (y.ndim - 1))), y, 0.0)


@contextlib.contextmanager
def fast_training_ops() -> Iterator[None]:
    """Within the block, the model's SSD scan and attention use the one-row training forms."""
    fast = {
        "causal_conv1d_prefill": one_row_causal_conv1d,
        "ssd_chunk_scan": one_row_ssd_scan,
        "paged_attention": one_row_paged_attention,
    }
    saved = {name: getattr(ops, name) for name in fast}
    for name, op in fast.items():
        setattr(ops, name, op)
    try:
        yield
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)
