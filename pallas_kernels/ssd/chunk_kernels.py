"""The four Pallas kernels behind `ssd_chunk_scan`, in the SSD paper's order (arXiv 2405.21060).

Chunks of Q tokens end at absolute multiples of Q inside each row; the wrapper lists them flat
(`chunk_t0` [NC]: first flat token, `chunk_n` [NC]: live tokens, 0 for unused entries).

1. `state_kernel`, grid (H, NC, P/bp), all chunks in parallel: dt' and the chunk-relative
   cumulative log decay `cum` (to [H, T] buffers), and the chunk's own state
   sum_t exp(cum_last - cum_t) dt'_t x_t B_t^T, built block by block of bq tokens.
2. `pass_kernel`, grid (R + 1, H, N/bn), one short sequential walk per row over chunk states
   only: s_in(c) = exp(cum_last(c - 1)) s_in(c - 1) + state(c - 1), starting from the row's slot,
   in fp32; it writes the state entering each chunk in x's dtype (the output kernel's dot operand
   dtype, so nothing is rounded twice) and the final and block-boundary states to their slots. The
   extra program row zeroes the padding tokens of y.
3. `cb_kernel`, grid (NC, G, (Q/bq)^2), the group's C_i B_k^T for token blocks k <= i of a chunk,
   once per group (H/G heads share it), fp32.
4. `output_kernel`, grid (H / heads per program, NC * Q/bq, P/bp), all token blocks in parallel:
   y_i = exp(cum_i) C_i s_in^T + sum_{k <= i} (CB_ik * exp(cum_i - cum_k) * dt'_k) x_k
   + D x_i, gated by silu(z_i); the tokens before the block enter through its start (one decay
   per token, not per pair), only the block's own tiles take the pairwise decay.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    dt_activation,
    live_slot,
    safe_slot,
    silu,
    store_boundary_state,
)


def mixed_dot(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """a @ b with operands in `dtype` (bf16 on the fast path) and an fp32 accumulator."""
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    return jnp.dot(
        a.astype(dtype), b.astype(dtype), precision=precision, preferred_element_type=jnp.float32
    )


def _local_cumsum(v: jax.Array) -> jax.Array:
    """Inclusive cumsum of a short vector as a masked row sum (no scan primitive in Triton)."""
    q = v.shape[0]
    causal = jnp.arange(q)[None, :] <= jnp.arange(q)[:, None]
    return jnp.sum(jnp.where(causal, v[None, :], 0.0), axis=1)


def state_kernel(
    t0_ref,
    n_ref,
    x_ref,
    dt_ref,
    a_ref,
    b_ref,
    bias_ref,
    st_ref,
    cum_ref,
    dtp_ref,
    *,
    heads_per_group,
    head_dim,
    state_size,
    block_q,
    block_p,
    block_n,
    dt_softplus,
    dt_limit,
):
    """Program (head, chunk, P-block): the chunk's own state and its dt', cum (P-block 0 only)."""
    h, c, pb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    t0, n = t0_ref[c], n_ref[c]
    g = h // heads_per_group
    p_mask = pb * block_p + jnp.arange(block_p) < head_dim
    n_mask = jnp.arange(block_n) < state_size
    p_sl, n_sl = pl.ds(pb * block_p, block_p), pl.ds(0, block_n)
    rows = jnp.arange(block_q)
    dtype = x_ref.dtype

    @pl.when(n > 0)
    def _():
        a = a_ref[h].astype(jnp.float32)
        bias = bias_ref[h].astype(jnp.float32)

        def body(j, carry):
            s, base = carry
            tok = pl.ds(t0 + j * block_q, block_q)
            valid = j * block_q + rows < n
            dt = plgpu.load(dt_ref.at[tok, h], mask=valid, other=0.0).astype(jnp.float32)
            dt = jnp.where(valid, dt_activation(dt + bias, dt_softplus, dt_limit), 0.0)
            cum = _local_cumsum(dt * a)
            total = jnp.sum(dt * a)
            first = valid & (pb == 0)
            plgpu.store(cum_ref.at[h, tok], base + cum, mask=first)
            plgpu.store(dtp_ref.at[h, tok], dt, mask=first)
            x = plgpu.load(x_ref.at[tok, h, p_sl], mask=valid[:, None] & p_mask[None, :], other=0)
            bm = plgpu.load(b_ref.at[tok, g, n_sl], mask=valid[:, None] & n_mask[None, :], other=0)
            weight = dt * jnp.exp(total - cum)
            xw = x.astype(jnp.float32) * weight[:, None]
            s = jnp.exp(total) * s + mixed_dot(xw.T, bm, dtype)
            return s, base + total

        s0 = jnp.zeros((block_p, block_n), jnp.float32)
        s, _ = jax.lax.fori_loop(0, pl.cdiv(n, block_q), body, (s0, jnp.float32(0.0)))
        mask = p_mask[:, None] & n_mask[None, :]
        plgpu.store(st_ref.at[c, h, p_sl, n_sl], s, mask=mask)


def pass_kernel(
    qsl_ref,
    nc_ref,
    init_ref,
    read_ref,
    write_ref,
    bnd_ref,
    cstart_ref,
    nch_ref,
    t0_ref,
    n_ref,
    cum_ref,
    st_ref,
    pool_in_ref,
    ent_ref,
    pool_ref,
    y_ref,
    *,
    num_rows,
    num_tokens,
    head_dim,
    state_size,
    block_t,
    block_p,
    block_n,
    block_size,
):
    """Program (row, head, N-block): the row's chunk states in order; row R zeroes padding y."""
    del pool_in_ref  # aliased to pool_ref
    r, h, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    p_mask = jnp.arange(block_p) < head_dim
    n_mask = nb * block_n + jnp.arange(block_n) < state_size
    pn_mask = p_mask[:, None] & n_mask[None, :]
    p_sl, n_sl = pl.ds(0, block_p), pl.ds(nb * block_n, block_n)

    @pl.when((r == num_rows) & (nb == 0))
    def _():
        pad0 = qsl_ref[num_rows]
        rows = jnp.arange(block_t)

        def body(k, carry):
            t = pad0 + k * block_t + rows
            mask = (t < num_tokens)[:, None] & p_mask[None, :]
            zeros = jnp.zeros((block_t, block_p), y_ref.dtype)
            plgpu.store(y_ref.at[pl.ds(pad0 + k * block_t, block_t), h, p_sl], zeros, mask=mask)
            return carry

        jax.lax.fori_loop(0, pl.cdiv(num_tokens - pad0, block_t), body, 0)

    @pl.when(r < num_rows)
    def _():
        pos0, start = nc_ref[r], qsl_ref[r]
        read = jnp.where(init_ref[r] != 0, read_ref[r], 0)
        num_slots = pool_ref.shape[0]
        s = plgpu.load(
            pool_ref.at[safe_slot(read, num_slots), h, p_sl, n_sl],
            mask=pn_mask & live_slot(read, num_slots),
            other=0.0,
        ).astype(jnp.float32)

        def body(k, s):
            c = cstart_ref[r] + k
            t0, n = t0_ref[c], n_ref[c]
            own = plgpu.load(st_ref.at[c, h, p_sl, n_sl], mask=pn_mask, other=0.0)
            plgpu.store(ent_ref.at[c, h, p_sl, n_sl], s.astype(ent_ref.dtype), mask=pn_mask)
            s = jnp.exp(cum_ref[h, t0 + n - 1]) * s + own
            if block_size is not None:  # prefix caching: the state at each block boundary
                end = pos0 + t0 - start + n
                store_boundary_state(
                    pool_ref, bnd_ref, r, end, pos0, block_size, (h, p_sl, n_sl), s, pn_mask
                )
            return s

        s = jax.lax.fori_loop(0, nch_ref[r], body, s)
        write = write_ref[r]
        plgpu.store(
            pool_ref.at[safe_slot(write, num_slots), h, p_sl, n_sl],
            s.astype(pool_ref.dtype),
            mask=pn_mask & live_slot(write, num_slots),
        )


def cb_kernel(
    t0_ref,
    n_ref,
    b_ref,
    c_ref,
    cb_ref,
    *,
    state_size,
    blocks_per_chunk,
    block_q,
    block_n,
    dot_dtype,
):
    """Program (chunk, group, token-block pair i, k): CB[i, k] = C_i B_k^T for k <= i, fp32.

    Blocks the output kernel never reads (k > i, or i past the chunk's tokens) are not written."""
    c, g, ik = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    i, k = ik // blocks_per_chunk, ik % blocks_per_chunk
    t0, n = t0_ref[c], n_ref[c]

    @pl.when((k <= i) & (i * block_q < n))
    def _():
        rows = jnp.arange(block_q)
        n_mask = jnp.arange(block_n) < state_size
        n_sl = pl.ds(0, block_n)
        valid_q, valid_k = i * block_q + rows < n, k * block_q + rows < n
        cm = plgpu.load(
            c_ref.at[pl.ds(t0 + i * block_q, block_q), g, n_sl],
            mask=valid_q[:, None] & n_mask[None, :],
            other=0.0,
        )
        bm = plgpu.load(
            b_ref.at[pl.ds(t0 + k * block_q, block_q), g, n_sl],
            mask=valid_k[:, None] & n_mask[None, :],
            other=0.0,
        )
        cb = mixed_dot(cm, bm.T, dot_dtype)
        plgpu.store(cb_ref.at[c, g, pl.ds(i * block_q, block_q), pl.ds(k * block_q, block_q)], cb)


def output_kernel(
    t0_ref,
    n_ref,
    x_ref,
    cum_ref,
    dtp_ref,
    cb_ref,
    c_ref,
    d_ref,
    z_ref,
    ent_ref,
    y_in_ref,
    y_ref,
    *,
    heads_per_group,
    heads_per_program,
    head_dim,
    state_size,
    blocks_per_chunk,
    block_q,
    block_k,
    block_p,
    block_n,
    has_z,
):
    """Program (heads, chunk x token block, P-block): y for block_q tokens of one chunk and
    `heads_per_program` heads of one group (they share its C rows and C B^T tiles, loaded once),
    summing over the chunk's earlier tokens in tiles of block_k (a divisor of block_q)."""
    del y_in_ref  # aliased to y_ref (its padding tokens were zeroed by pass_kernel)
    hp, ci, pb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    c, i = ci // blocks_per_chunk, ci % blocks_per_chunk
    t0, n = t0_ref[c], n_ref[c]
    heads = [hp * heads_per_program + j for j in range(heads_per_program)]
    g = heads[0] // heads_per_group
    p_mask = pb * block_p + jnp.arange(block_p) < head_dim
    n_mask = jnp.arange(block_n) < state_size
    p_sl, n_sl = pl.ds(pb * block_p, block_p), pl.ds(0, block_n)
    rows, cols = jnp.arange(block_q), jnp.arange(block_k)
    tiles = block_q // block_k
    dtype = x_ref.dtype

    def token_tile(k, h, live):  # x, cum and dt' of token tile k for head h
        tk = pl.ds(t0 + k * block_k, block_k)
        xk = plgpu.load(x_ref.at[tk, h, p_sl], mask=live[:, None] & p_mask[None, :], other=0)
        cum_k = plgpu.load(cum_ref.at[h, tk], mask=live, other=0.0)
        dt_k = plgpu.load(dtp_ref.at[h, tk], mask=live, other=0.0)
        return xk, cum_k, dt_k

    @pl.when(i * block_q < n)
    def _():
        tq = pl.ds(t0 + i * block_q, block_q)
        q_rows = pl.ds(i * block_q, block_q)
        valid_q = i * block_q + rows < n
        cm = plgpu.load(c_ref.at[tq, g, n_sl], mask=valid_q[:, None] & n_mask[None, :], other=0.0)
        cum_q = [plgpu.load(cum_ref.at[h, tq], mask=valid_q, other=0.0) for h in heads]
        # What precedes the block reaches it through the block's start b:
        #   y_q = exp(cum_q - cum_b) [exp(cum_b) C_q s_in^T + sum_{k < b} CB_qk exp(cum_b - cum_k)
        #         dt'_k x_k] + the block's own causal part.
        # cum is the chunk's cumulative log decay (0 before its first token, falling), so every
        # exponent is <= 0 (no overflow) and the earlier tiles take one exp per token, not one
        # per (q, k) pair.
        b = jnp.maximum(t0 + i * block_q - 1, 0)
        cum_b = [jnp.where(i > 0, cum_ref[h, b], 0.0) for h in heads]
        acc = []
        for h, start in zip(heads, cum_b, strict=True):
            s_in = plgpu.load(
                ent_ref.at[c, h, p_sl, n_sl], mask=p_mask[:, None] & n_mask[None, :], other=0.0
            )
            acc.append(jnp.exp(start) * mixed_dot(cm, s_in.T, dtype))

        # Token tile k wholly before the block: its tokens are all live (the masks only keep
        # arrays shorter than a tile in bounds in interpret mode).
        def before(k, acc):
            live = k * block_k + cols < n
            cb = cb_ref[c, g, q_rows, pl.ds(k * block_k, block_k)]
            out = []
            for h, start, a in zip(heads, cum_b, acc, strict=True):
                xk, cum_k, dt_k = token_tile(k, h, live)
                out.append(a + mixed_dot(cb * (jnp.exp(start - cum_k) * dt_k)[None, :], xk, dtype))
            return tuple(out)

        def own(k, ys):  # token tile k inside the block: causal, decay per (q, k) pair
            valid_k = k * block_k + cols < n
            cb = plgpu.load(
                cb_ref.at[c, g, q_rows, pl.ds(k * block_k, block_k)],
                mask=valid_q[:, None] & valid_k[None, :],
                other=0.0,
            )
            causal = (k * block_k + cols[None, :] <= i * block_q + rows[:, None]) & valid_k[None, :]
            out = []
            for h, cq, y in zip(heads, cum_q, ys, strict=True):
                xk, cum_k, dt_k = token_tile(k, h, valid_k)
                decay = jnp.where(causal, jnp.exp(cq[:, None] - cum_k[None, :]), 0.0)
                out.append(y + mixed_dot(cb * decay * dt_k[None, :], xk, dtype))
            return tuple(out)

        acc = jax.lax.fori_loop(0, i * tiles, before, tuple(acc))
        ys = tuple(
            jnp.exp(cq - start)[:, None] * a for cq, start, a in zip(cum_q, cum_b, acc, strict=True)
        )
        ys = jax.lax.fori_loop(i * tiles, (i + 1) * tiles, own, ys)
        qp = valid_q[:, None] & p_mask[None, :]
        for h, y in zip(heads, ys, strict=True):
            xq = plgpu.load(x_ref.at[tq, h, p_sl], mask=qp, other=0.0).astype(jnp.float32)
            y = y + d_ref[h].astype(jnp.float32) * xq
            if has_z:
                zq = plgpu.load(z_ref.at[tq, h, p_sl], mask=qp, other=0.0)
                y = y * silu(zq.astype(jnp.float32))
            plgpu.store(y_ref.at[tq, h, p_sl], y.astype(y_ref.dtype), mask=qp)


def chunk_table(
    query_start_loc: jax.Array, num_computed: jax.Array, num_tokens: int, chunk: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Flat list of the chunks (ending at absolute multiples of `chunk`) of every row.

    Returns chunk_t0 [NC] (first flat token), chunk_n [NC] (tokens; 0 for unused entries),
    row_start [R] (index of the row's first chunk) and row_chunks [R], with the static bound
    NC = T // chunk + 2R: a row of L tokens meets at most L // chunk + 2 chunks (a short row can
    straddle a chunk boundary). A smaller table would drop chunks, leaving outputs unwritten.
    """
    num_rows = query_start_loc.shape[0] - 1
    length = query_start_loc[1:] - query_start_loc[:-1]
    first = jnp.minimum(length, chunk - num_computed % chunk)
    nch = jnp.where(length > 0, (length - first + chunk - 1) // chunk + 1, 0)
    cend = jnp.cumsum(nch)
    cstart = cend - nch
    c = jnp.arange(num_tokens // chunk + 2 * num_rows, dtype=jnp.int32)
    r = jnp.minimum(jnp.sum(cend[None, :] <= c[:, None], axis=1), num_rows - 1)
    k = c - cstart[r]
    off = jnp.where(k == 0, 0, first[r] + (k - 1) * chunk)
    n = jnp.where(k == 0, first[r], jnp.minimum(chunk, length[r] - off))
    n = jnp.where(c < cend[num_rows - 1], n, 0)
    i32 = jnp.int32
    return (
        (query_start_loc[r] + off).astype(i32),
        n.astype(i32),
        cstart.astype(i32),
        nch.astype(i32),
    )
