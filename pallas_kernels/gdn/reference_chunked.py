"""The chunked (WY / UT-transform) form of the Gated DeltaNet prefill, in plain jnp: the math the
Pallas kernel implements, tested equal to the token-by-token definition of `gdn/reference.py`.

Chunks of C tokens end at absolute multiples of C inside each row (`Rows.num_computed`), so the
result does not depend on how a prompt was chunked. Per chunk and value head, with G the in-chunk
cumulative log decay and A = strict-lower(beta_i (k_i . k_j) exp(G_i - G_j)):
    T = (I + A)^-1;  U = T (beta v);  W = T (beta exp(G) k)
    v_new = U - W S^T;  o = exp(G) q S^T + ((q k^T) o causal decay) v_new
    S = exp(G_last) S + v_new^T (exp(G_last - G) k)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.gdn.reference import (
    HIGHEST,
    boundary_tokens,
    check_chunk_args,
    prepare_qk,
    read_initial,
    scatter_states,
)
from pallas_kernels.rows import Rows


def chunk_table(query_start_loc: jax.Array, num_computed: jax.Array, T: int, chunk_size: int):
    """Static-size table of the chunks of a varlen batch, chunks aligned to absolute positions.

    Returns int32 arrays [NC] (NC = T // C + 2R bounds the count): row (R for unused entries), the
    flat token index of tile slot 0 (slot i holds token tok0 + i when it lies in the row), the
    row-local chunk index j and whether the chunk is the row's first / last.
    """
    C = chunk_size
    R = num_computed.shape[0]
    nc_max = T // C + 2 * R
    length = query_start_loc[1:] - query_start_loc[:-1]
    off = num_computed % C
    count = jnp.where(length > 0, (off + length + C - 1) // C, 0)
    ends = jnp.cumsum(count)
    c = jnp.arange(nc_max)
    row = jnp.searchsorted(ends, c, side="right").astype(jnp.int32)
    rowc = jnp.minimum(row, R - 1)
    j = c - (ends[rowc] - count[rowc])
    tok0 = query_start_loc[rowc] - off[rowc] + j * C
    return row, tok0.astype(jnp.int32), j, j == 0, j == count[rowc] - 1


def chunk_math(s, q, k, v, g, beta):
    """One chunk for all heads, WY / UT form. s [HV, V, K]; q, k [HV, C, K]; v [HV, C, V];
    g, beta [HV, C] (masked slots: k = q = v = g = beta = 0). Returns (new s, o [HV, C, V])."""
    C = q.shape[1]
    G = jnp.cumsum(g, axis=-1)
    ii, jj = jnp.arange(C)[:, None], jnp.arange(C)[None, :]
    diff = G[:, :, None] - G[:, None, :]
    decay_incl = jnp.where(ii >= jj, jnp.exp(jnp.where(ii >= jj, diff, 0.0)), 0.0)
    kk = jnp.einsum("hik,hjk->hij", k, k, precision=HIGHEST)
    A = jnp.where(ii > jj, beta[:, :, None] * kk * decay_incl, 0.0)
    eye = jnp.broadcast_to(jnp.eye(C, dtype=jnp.float32), A.shape)
    Tinv = jax.scipy.linalg.solve_triangular(eye + A, eye, lower=True, unit_diagonal=True)
    eG = jnp.exp(G)
    U = jnp.einsum("hij,hjv->hiv", Tinv, beta[..., None] * v, precision=HIGHEST)
    W = jnp.einsum("hij,hjk->hik", Tinv, (beta * eG)[..., None] * k, precision=HIGHEST)
    v_new = U - jnp.einsum("hck,hvk->hcv", W, s, precision=HIGHEST)
    qk = jnp.einsum("hik,hjk->hij", q, k, precision=HIGHEST) * decay_incl
    o = jnp.einsum("hck,hvk->hcv", eG[..., None] * q, s, precision=HIGHEST)
    o = o + jnp.einsum("hij,hjv->hiv", qk, v_new, precision=HIGHEST)
    g_last = G[:, -1]
    kd = jnp.exp(g_last[:, None] - G)[..., None] * k
    s = jnp.exp(g_last)[:, None, None] * s + jnp.einsum(
        "hcv,hck->hvk", v_new, kd, precision=HIGHEST
    )
    return s, o


def gdn_chunk_reference_chunked(
    q, k, v, g, beta, state, rows: Rows, *, scale=None, use_qk_l2norm=True, chunk_size=64
):
    """Chunked (WY / UT-transform) form of `gdn_chunk_reference`; same arguments and results."""
    R = check_chunk_args(q, k, v, g, beta, state, rows, chunk_size)
    query_start_loc, num_computed = rows.query_start_loc, rows.num_computed
    block_size, boundary_slots = rows.block_size, rows.boundary_slots
    T, HV, V = v.shape
    C = chunk_size
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    init = read_initial(state, rows.read_slots, rows.has_initial_state)
    row, tok0, jloc, first, last = chunk_table(query_start_loc, num_computed, T, C)
    nb = 0 if boundary_slots is None else boundary_slots.shape[1]
    bounds0 = jnp.zeros((R, max(nb, 1)) + init.shape[1:], jnp.float32)

    def tile(x, tok, valid):  # [T, HV, D] -> [HV, C, D], zeros outside the row
        m = valid.reshape((-1,) + (1,) * (x.ndim - 1))
        t = jnp.where(m, x[jnp.clip(tok, 0, T - 1)].astype(jnp.float32), 0.0)
        return jnp.swapaxes(t, 0, 1)

    def body(carry, c):
        s, final, bounds, o_all = carry
        r = jnp.minimum(row[c], R - 1)
        tok = tok0[c] + jnp.arange(C)
        valid = (row[c] < R) & (tok >= query_start_loc[r]) & (tok < query_start_loc[r + 1])
        s = jnp.where(first[c], init[r], s)
        gb = tile(jnp.stack([g, beta], -1), tok, valid)
        s, o = chunk_math(
            s,
            tile(qf, tok, valid),
            tile(kf, tok, valid),
            tile(v, tok, valid),
            gb[..., 0],
            gb[..., 1],
        )
        o_all = o_all.at[jnp.where(valid, tok, T)].set(jnp.swapaxes(o, 0, 1), mode="drop")
        final = final.at[r].set(jnp.where((row[c] < R) & last[c], s, final[r]))
        if nb:
            p1 = num_computed[r] - num_computed[r] % C + (jloc[c] + 1) * C
            jb = jnp.clip(p1 // block_size - num_computed[r] // block_size - 1, 0, nb - 1)
            hit = valid[C - 1] & (p1 % block_size == 0)
            bounds = bounds.at[r, jb].set(jnp.where(hit, s, bounds[r, jb]))
        return (s, final, bounds, o_all), None

    o0 = jnp.zeros((T, HV, V), jnp.float32)
    carry = (jnp.zeros_like(init[0]), init, bounds0, o0)
    (_, final, bounds, o), _ = jax.lax.scan(body, carry, jnp.arange(row.shape[0]))
    if nb and boundary_slots is not None:  # nb > 0: there are boundary slots
        _, hit = boundary_tokens(rows, nb)
        slots = jnp.where(hit, boundary_slots, 0).reshape(-1)
        state = scatter_states(state, slots, bounds.reshape((-1,) + bounds.shape[2:]))
    state = scatter_states(state, rows.write_slots, final)
    return o.astype(v.dtype), state
