"""The single-launch SSD scan: one program per (row, head, P-block) walks its row's chunks in order.

Kept beside the parallel kernels of `ssd/chunk_kernels.py` because it wins when there are many
rows: every program does the whole chunk math with the state in registers, so nothing but x, B, C,
dt, y and the slot states crosses DRAM, but the critical path is one row's chain of chunks. On the
H100 it beats the three phases at 8x2048 and trails them at 1x8192 (benchmarks/results/README.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    dt_activation,
    live_slot,
    safe_slot,
    sds_like,
    silu,
    store_boundary_state,
)
from pallas_kernels.ssd.chunk_kernels import mixed_dot


def _chunk(s, x, dt, a, bm, cm, dtype):
    """One chunk of n <= Q tokens (rows past n are zero, dt = 0 there). Returns (y, new state).

    The SSD paper's steps, for one head and a block of head-dim rows; s is [BP, N]:
      1. cum = cumsum(dt A): the log decay from the chunk start through each token
      2. y_diag = ((C B^T) * exp(segsum) * dt) x        (intra-chunk, the diagonal blocks)
      3. y_off  = exp(cum) * (C s^T)                     (the state entering the chunk)
      4. s' = exp(cum_last) s + (x * dt * exp(cum_last - cum))^T B
    """
    q = x.shape[0]
    i, j = jnp.arange(q)[:, None], jnp.arange(q)[None, :]
    causal = j <= i
    log_decay = dt * a
    cum = jnp.sum(jnp.where(causal, log_decay[None, :], 0.0), axis=1)  # 1. (inclusive cumsum)
    total = jnp.sum(log_decay)
    segsum = jnp.where(causal, cum[:, None] - cum[None, :], -jnp.inf)
    scores = mixed_dot(cm, bm.T, dtype) * jnp.exp(segsum) * dt[None, :]
    y = mixed_dot(scores, x, dtype)  # 2.
    y = y + jnp.exp(cum)[:, None] * mixed_dot(cm, s.T, dtype)  # 3.
    weight = dt * jnp.exp(total - cum)
    s = jnp.exp(total) * s + mixed_dot((x * weight[:, None]).T, bm, dtype)  # 4.
    return y, s


def _scan_kernel(
    qsl_ref,
    nc_ref,
    init_ref,
    read_ref,
    write_ref,
    bnd_ref,
    x_ref,
    dt_ref,
    a_ref,
    b_ref,
    c_ref,
    d_ref,
    z_ref,
    bias_ref,
    state_in_ref,
    y_ref,
    state_ref,
    *,
    num_rows,
    num_tokens,
    heads_per_group,
    head_dim,
    state_size,
    block_q,
    block_p,
    block_n,
    dt_softplus,
    dt_limit,
    has_z,
    block_size,
):
    """Program (row, head, P-block): the row's chunks in order, the state kept in registers."""
    del state_in_ref  # aliased to state_ref
    r, h, pb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    g = h // heads_per_group
    p_mask = pb * block_p + jnp.arange(block_p) < head_dim
    n_mask = jnp.arange(block_n) < state_size
    p_sl, n_sl = pl.ds(pb * block_p, block_p), pl.ds(0, block_n)
    dtype = x_ref.dtype
    rows = jnp.arange(block_q)

    @pl.when(r == num_rows)  # the extra program row zeroes the padding tokens
    def _():
        pad0 = qsl_ref[num_rows]

        def body(k, carry):
            t = pad0 + k * block_q + rows
            zeros = jnp.zeros((block_q, block_p), y_ref.dtype)
            mask = (t < num_tokens)[:, None] & p_mask[None, :]
            plgpu.store(y_ref.at[pl.ds(pad0 + k * block_q, block_q), h, p_sl], zeros, mask=mask)
            return carry

        jax.lax.fori_loop(0, pl.cdiv(num_tokens - pad0, block_q), body, 0)

    @pl.when(r < num_rows)
    def _():
        start, length, pos0 = qsl_ref[r], qsl_ref[r + 1] - qsl_ref[r], nc_ref[r]
        read = jnp.where(init_ref[r] != 0, read_ref[r], 0)
        pn_mask = p_mask[:, None] & n_mask[None, :]
        num_slots = state_ref.shape[0]
        s = plgpu.load(
            state_ref.at[safe_slot(read, num_slots), h, p_sl, n_sl],
            mask=pn_mask & live_slot(read, num_slots),
            other=0.0,
        ).astype(jnp.float32)
        a = a_ref[h].astype(jnp.float32)
        d_skip, bias = d_ref[h].astype(jnp.float32), bias_ref[h].astype(jnp.float32)
        # Chunks end where the absolute position is a multiple of block_q.
        first = jnp.minimum(length, block_q - pos0 % block_q)
        num_chunks = jnp.where(length > 0, pl.cdiv(length - first, block_q) + 1, 0)

        def body(k, s):
            off = jnp.where(k == 0, 0, first + (k - 1) * block_q)
            n = jnp.where(k == 0, first, jnp.minimum(block_q, length - off))
            tok = pl.ds(start + off, block_q)
            valid = rows < n
            qp = valid[:, None] & p_mask[None, :]
            qn = valid[:, None] & n_mask[None, :]
            x = plgpu.load(x_ref.at[tok, h, p_sl], mask=qp, other=0.0)
            dt = plgpu.load(dt_ref.at[tok, h], mask=valid, other=0.0).astype(jnp.float32)
            dt = jnp.where(valid, dt_activation(dt + bias, dt_softplus, dt_limit), 0.0)
            bm = plgpu.load(b_ref.at[tok, g, n_sl], mask=qn, other=0.0)
            cm = plgpu.load(c_ref.at[tok, g, n_sl], mask=qn, other=0.0)
            y, s = _chunk(s, x.astype(jnp.float32), dt, a, bm, cm, dtype)
            y = y + d_skip * x.astype(jnp.float32)
            if has_z:
                zv = plgpu.load(z_ref.at[tok, h, p_sl], mask=qp, other=0.0).astype(jnp.float32)
                y = y * silu(zv)
            plgpu.store(y_ref.at[tok, h, p_sl], y.astype(y_ref.dtype), mask=qp)
            if block_size is not None:  # prefix caching: the state at each block boundary
                end = pos0 + off + n
                store_boundary_state(
                    state_ref, bnd_ref, r, end, pos0, block_size, (h, p_sl, n_sl), s, pn_mask
                )
            return s

        s = jax.lax.fori_loop(0, num_chunks, body, s)
        write = write_ref[r]
        plgpu.store(
            state_ref.at[safe_slot(write, num_slots), h, p_sl, n_sl],
            s.astype(state_ref.dtype),
            mask=pn_mask & live_slot(write, num_slots),
        )


def sequential_scan(
    meta: tuple[jax.Array, ...],
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    D: jax.Array,
    z: jax.Array | None,
    dt_bias: jax.Array,
    ssm_state: jax.Array,
    *,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    block_size: int | None,
    block_q: int,
    block_p: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Grid (R + 1, H, P / block_p); meta = `Rows.int32_operands()`. The extra program row zeroes
    the padding tokens. Chunks of block_q tokens."""
    num_rows = meta[0].shape[0] - 1
    heads, head_dim = x.shape[1], x.shape[2]
    groups, state_size = B.shape[1], B.shape[2]
    kernel = functools.partial(
        _scan_kernel,
        num_rows=num_rows,
        num_tokens=x.shape[0],
        heads_per_group=heads // groups,
        head_dim=head_dim,
        state_size=state_size,
        block_q=block_q,
        block_p=block_p,
        block_n=max(16, pl.next_power_of_2(state_size)),
        dt_softplus=dt_softplus,
        dt_limit=tuple(dt_limit),
        has_z=z is not None,
        block_size=block_size,
    )
    return pl.pallas_call(
        kernel,
        out_shape=(sds_like(x), sds_like(ssm_state)),
        grid=(num_rows + 1, heads, pl.cdiv(head_dim, block_p)),
        input_output_aliases={14: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ssd_chunk_scan_sequential",
    )(*meta, x, dt, A, B, C, D, x if z is None else z, dt_bias, ssm_state)
