"""Mamba2 SSD prefill over ragged sequences, with slot-indexed initial, final and boundary states.

Glossary (Mamba-2 paper, arXiv 2405.21060): T flat tokens, R rows, H heads, P head dim, G groups
(head h uses group h // (H // G)), N state size, S state slots. Per head the state s is [P, N]:
    dt' = clamp(softplus(dt + dt_bias), *dt_limit)
    s   = exp(dt' A) s + dt' x B^T          (x: [P], B: [N])
    y   = s C + D x, gated by silu(z)        (C: [N])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    check_int,
    check_shape,
    dt_activation,
    gather_slots,
    pow2,
    process_dt,
    scatter_slots,
    sds_like,
    silu,
    token_rows,
)


def check_args(
    x,
    dt,
    A,
    B,
    C,
    ssm_state,
    query_start_loc,
    num_computed,
    has_initial_state,
    read_slots,
    write_slots,
    D,
    z,
    dt_bias,
    chunk_size,
    block_size,
    boundary_slots,
):
    """Validate shapes and options; return (T, H, P, G, N, R)."""
    num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[1], B.shape[2]
    num_rows = query_start_loc.shape[0] - 1
    check_shape("dt", dt, (num_tokens, heads))
    check_shape("A", A, (heads,))
    check_shape("B", B, (num_tokens, None, None))
    check_shape("C", C, (num_tokens, groups, state_size))
    check_shape("ssm_state", ssm_state, (None, heads, head_dim, state_size))
    for name, a in (
        ("num_computed", num_computed),
        ("has_initial_state", has_initial_state),
        ("read_slots", read_slots),
        ("write_slots", write_slots),
    ):
        check_shape(name, a, (num_rows,))
    check_shape("D", D, (heads,))
    check_shape("z", z, x.shape)
    check_shape("dt_bias", dt_bias, (heads,))
    if groups < 1 or heads % groups:
        raise ValueError(f"B has {groups} groups; must divide the {heads} heads of x")
    check_int("chunk_size", chunk_size, 1)
    if (block_size is None) != (boundary_slots is None):
        raise ValueError("block_size and boundary_slots must be given together")
    if block_size is not None:
        if block_size % chunk_size:
            raise ValueError(
                f"block_size={block_size} must be a multiple of chunk_size={chunk_size}"
            )
        check_shape("boundary_slots", boundary_slots, (num_rows, None))
    return num_tokens, heads, head_dim, groups, state_size, num_rows


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit", "chunk_size", "block_size"))
def ssd_chunk_scan_reference(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    query_start_loc: jax.Array,
    num_computed: jax.Array,
    has_initial_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = 256,
    block_size: int | None = None,
    boundary_slots: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The definition, one token at a time. x [T, H, P] -> (y [T, H, P], ssm_state [S, H, P, N]).

    One lax.scan over the flat tokens carries the state, resets it to the row's initial state at
    each row start, and writes the final state (and the block-boundary states) into the pool as it
    goes.
    `chunk_size` does not change the result of this definition; it is only validated.
    """
    num_tokens, heads, _, groups, _, num_rows = check_args(
        x,
        dt,
        A,
        B,
        C,
        ssm_state,
        query_start_loc,
        num_computed,
        has_initial_state,
        read_slots,
        write_slots,
        D,
        z,
        dt_bias,
        chunk_size,
        block_size,
        boundary_slots,
    )
    rep = heads // groups
    init = gather_slots(ssm_state, read_slots, has_initial_state)  # [R, H, P, N]
    lengths = query_start_loc[1:] - query_start_loc[:-1]
    # Rows without tokens still publish their (initial) state.
    pool = scatter_slots(ssm_state, jnp.where(lengths == 0, write_slots, 0), init)

    row, live = token_rows(query_start_loc, num_tokens)
    local = jnp.arange(num_tokens, dtype=jnp.int32) - query_start_loc[row]
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit)  # [T, H]
    a = A.astype(jnp.float32)
    d_skip = jnp.zeros((heads,), jnp.float32) if D is None else D.astype(jnp.float32)
    no_slot = jnp.int32(pool.shape[0])

    def step(carry, t):
        s, pool = carry
        r = row[t]
        s = jnp.where(local[t] == 0, init[r], s)
        xt = x[t].astype(jnp.float32)  # [H, P]
        bt = jnp.repeat(B[t].astype(jnp.float32), rep, axis=0)  # [H, N]
        ct = jnp.repeat(C[t].astype(jnp.float32), rep, axis=0)
        s = (
            jnp.exp(dtp[t] * a)[:, None, None] * s
            + (dtp[t][:, None] * xt)[:, :, None] * bt[:, None, :]
        )
        y = jnp.einsum("hpn,hn->hp", s, ct, precision="highest") + d_skip[:, None] * xt
        if z is not None:
            y = y * silu(z[t].astype(jnp.float32))
        y = jnp.where(live[t], y, 0.0)
        last = live[t] & (local[t] == lengths[r] - 1) & (write_slots[r] > 0)
        pool = pool.at[jnp.where(last, write_slots[r], no_slot)].set(
            s.astype(pool.dtype), mode="drop"
        )
        if block_size is not None:
            pos = num_computed[r] + local[t]
            j = (pos + 1) // block_size - num_computed[r] // block_size - 1
            jc = jnp.clip(j, 0, boundary_slots.shape[1] - 1)
            slot = boundary_slots[r, jc]
            hit = (
                live[t] & ((pos + 1) % block_size == 0) & (j < boundary_slots.shape[1]) & (slot > 0)
            )
            pool = pool.at[jnp.where(hit, slot, no_slot)].set(s.astype(pool.dtype), mode="drop")
        return (s, pool), y

    s0 = jnp.zeros(ssm_state.shape[1:], jnp.float32)
    (_, pool), y = jax.lax.scan(step, (s0, pool), jnp.arange(num_tokens, dtype=jnp.int32))
    return y.astype(x.dtype), pool


# ----------------------------------------------------------------------------- Pallas kernel


def _dot(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """a @ b with operands in `dtype` (bf16 on the fast path) and an fp32 accumulator."""
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    return jnp.dot(
        a.astype(dtype), b.astype(dtype), precision=precision, preferred_element_type=jnp.float32
    )


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
    scores = _dot(cm, bm.T, dtype) * jnp.exp(segsum) * dt[None, :]
    y = _dot(scores, x, dtype)  # 2.
    y = y + jnp.exp(cum)[:, None] * _dot(cm, s.T, dtype)  # 3.
    weight = dt * jnp.exp(total - cum)
    s = jnp.exp(total) * s + _dot((x * weight[:, None]).T, bm, dtype)  # 4.
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
        s = plgpu.load(
            state_ref.at[jnp.maximum(read, 0), h, p_sl, n_sl], mask=pn_mask & (read > 0), other=0.0
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
                j = end // block_size - pos0 // block_size - 1
                slot = bnd_ref[r, jnp.clip(j, 0, bnd_ref.shape[1] - 1)]
                hit = (end % block_size == 0) & (j < bnd_ref.shape[1]) & (slot > 0)
                plgpu.store(
                    state_ref.at[jnp.maximum(slot, 0), h, p_sl, n_sl],
                    s.astype(state_ref.dtype),
                    mask=pn_mask & hit,
                )
            return s

        s = jax.lax.fori_loop(0, num_chunks, body, s)
        write = write_ref[r]
        plgpu.store(
            state_ref.at[jnp.maximum(write, 0), h, p_sl, n_sl],
            s.astype(state_ref.dtype),
            mask=pn_mask & (write > 0),
        )


@functools.partial(
    jax.jit,
    static_argnames=(
        "dt_softplus",
        "dt_limit",
        "chunk_size",
        "block_size",
        "interpret",
        "block_q",
        "block_p",
        "num_warps",
        "num_stages",
    ),
)
def ssd_chunk_scan(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    query_start_loc: jax.Array,
    num_computed: jax.Array,
    has_initial_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = 256,
    block_size: int | None = None,
    boundary_slots: jax.Array | None = None,
    interpret: bool = False,
    block_q: int = 32,
    block_p: int = 64,
    num_warps: int = 4,
    num_stages: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernel for `ssd_chunk_scan_reference` (same arguments and results).

    Grid (R + 1, H, P / block_p): one program walks one row's chunks for one head, keeping the
    [block_p, N] state in registers; the extra program row zeroes the padding tokens. The kernel's
    chunk is `block_q`, a divisor of `chunk_size`, so chunk ends still fall on absolute multiples.
    """
    _, heads, head_dim, groups, state_size, num_rows = check_args(
        x,
        dt,
        A,
        B,
        C,
        ssm_state,
        query_start_loc,
        num_computed,
        has_initial_state,
        read_slots,
        write_slots,
        D,
        z,
        dt_bias,
        chunk_size,
        block_size,
        boundary_slots,
    )
    block_q = max(16, min(pow2(block_q), pow2(chunk_size)))
    if chunk_size % block_q:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of block_q={block_q}")
    block_p = max(16, min(pow2(block_p), pow2(head_dim)))
    zeros = jnp.zeros((heads,), jnp.float32)
    i32 = jnp.int32
    bnd = jnp.zeros((num_rows, 1), i32) if boundary_slots is None else boundary_slots.astype(i32)
    kernel = functools.partial(
        _scan_kernel,
        num_rows=num_rows,
        num_tokens=x.shape[0],
        heads_per_group=heads // groups,
        head_dim=head_dim,
        state_size=state_size,
        block_q=block_q,
        block_p=block_p,
        block_n=max(16, pow2(state_size)),
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
        name="ssd_chunk_scan",
    )(
        query_start_loc.astype(i32),
        num_computed.astype(i32),
        has_initial_state.astype(i32),
        read_slots.astype(i32),
        write_slots.astype(i32),
        bnd,
        x,
        dt,
        A,
        B,
        C,
        zeros if D is None else D,
        x if z is None else z,
        zeros if dt_bias is None else dt_bias,
        ssm_state,
    )
