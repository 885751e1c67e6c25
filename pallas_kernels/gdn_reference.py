"""Plain-jnp references for the Gated DeltaNet ops (fp32, jit-able, static shapes).

Two forms of the prefill op, tested equal:
- `gdn_chunk_reference`: the token-by-token recurrence (the definition; what CI compares against);
- `gdn_chunk_reference_chunked`: the chunked WY / UT-transform form, chunks aligned to absolute
  positions, the math the Pallas kernel implements.
Per value head hv (key head hv // (HV // HK)), state S [V, K]:
    S = S * exp(g);  delta = beta * (v - S @ k);  S = S + outer(delta, k);  o = S @ q
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._common import live_slot, safe_slot

HIGHEST = jax.lax.Precision.HIGHEST
L2_EPS = 1e-6


def l2norm(x: jax.Array) -> jax.Array:
    """x * rsqrt(sum(x^2) + 1e-6) over the last axis, in fp32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def prepare_qk(
    q: jax.Array, k: jax.Array, num_v_heads: int, scale: float | None, use_qk_l2norm: bool
) -> tuple[jax.Array, jax.Array]:
    """fp32 q, k [..., HK, K] -> [..., HV, K]: l2norm (optional), q *= scale, repeat per v-head."""
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    rep = num_v_heads // q.shape[-2]
    return jnp.repeat(q, rep, axis=-2), jnp.repeat(k, rep, axis=-2)


def gdn_gates(
    a: jax.Array, b: jax.Array, A_log: jax.Array, dt_bias: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Decode gating: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), in fp32."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    g = -jnp.exp(A_log.astype(jnp.float32)) * jax.nn.softplus(a + dt_bias.astype(jnp.float32))
    return g, jax.nn.sigmoid(b)


def delta_step(
    s: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One token, any leading batch dims: s [..., V, K], q/k [..., K], v [..., V], g/beta [...]."""
    s = s * jnp.exp(g)[..., None, None]
    sk = jnp.einsum("...vk,...k->...v", s, k, precision=HIGHEST)
    delta = beta[..., None] * (v - sk)
    s = s + delta[..., :, None] * k[..., None, :]
    return s, jnp.einsum("...vk,...k->...v", s, q, precision=HIGHEST)


def read_initial(
    state: jax.Array, read_slots: jax.Array, use: jax.Array | None = None
) -> jax.Array:
    """Gather fp32 states [N, HV, V, K] for slots [N]; zeros where the slot is not live (<= 0 or
    >= S) or `use` is False."""
    live = live_slot(read_slots, state.shape[0])
    live = live if use is None else live & use
    s = state[safe_slot(read_slots, state.shape[0])].astype(jnp.float32)
    return jnp.where(live[:, None, None, None], s, 0.0)  # where, not *: slot 0 may hold NaN


def scatter_states(state: jax.Array, slots: jax.Array, values: jax.Array) -> jax.Array:
    """state[slots[i]] = values[i] for live slots (flat [N] slots); others are dropped."""
    state = jnp.asarray(state)  # numpy pools are accepted outside jit
    idx = jnp.where(live_slot(slots, state.shape[0]), slots, state.shape[0])  # -> dropped
    return state.at[idx].set(values.astype(state.dtype), mode="drop")


def check_prefill_args(
    q,
    k,
    v,
    g,
    beta,
    state,
    query_start_loc,
    num_computed,
    has_init,
    read_slots,
    write_slots,
    chunk_size,
    block_size,
    boundary_slots,
) -> None:
    """Raise ValueError naming the first argument whose shape breaks the gdn_chunk contract."""
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    R = num_computed.shape[0]
    want = {
        "k": (k.shape, (T, HK, K)),
        "v": (v.shape, (T, HV, V)),
        "g": (g.shape, (T, HV)),
        "beta": (beta.shape, (T, HV)),
        "state": (state.shape[1:], (HV, V, K)),
        "query_start_loc": (query_start_loc.shape, (R + 1,)),
        "has_initial_state": (has_init.shape, (R,)),
        "read_slots": (read_slots.shape, (R,)),
        "write_slots": (write_slots.shape, (R,)),
    }
    for name, (got, exp) in want.items():
        if tuple(got) != tuple(exp):
            raise ValueError(f"{name} has shape {tuple(got)}, expected {exp}")
    if HV % HK:
        raise ValueError(f"value heads HV={HV} must be a multiple of key heads HK={HK}")
    if chunk_size <= 0 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size={chunk_size} must be a positive power of two")
    if (block_size is None) != (boundary_slots is None):
        raise ValueError("block_size and boundary_slots must be given together")
    if block_size is not None:
        if block_size <= 0 or block_size % chunk_size:
            raise ValueError(f"block_size={block_size} must be a positive multiple of {chunk_size}")
        if boundary_slots.ndim != 2 or boundary_slots.shape[0] != R:
            raise ValueError(f"boundary_slots has shape {boundary_slots.shape}, expected ({R}, NB)")


def row_of_tokens(query_start_loc: jax.Array, T: int) -> jax.Array:
    """Row index of each flat token [T]; R for padding tokens."""
    return jnp.searchsorted(query_start_loc[1:], jnp.arange(T), side="right").astype(jnp.int32)


def gdn_chunk_reference(
    q,
    k,
    v,
    g,
    beta,
    state,
    query_start_loc,
    num_computed,
    has_initial_state,
    read_slots,
    write_slots,
    *,
    scale=None,
    use_qk_l2norm=True,
    chunk_size=64,
    block_size=None,
    boundary_slots=None,
):
    """Token-by-token Gated DeltaNet prefill (the definition). Shapes as in ops_contract.md.

    q, k [T, HK, K]; v [T, HV, V]; g, beta [T, HV]; state [S, HV, V, K]; per-row int32 [R] args;
    query_start_loc [R + 1]. Returns (o [T, HV, V] in v.dtype, updated state pool).
    """
    check_prefill_args(q, k, v, g, beta, state, query_start_loc, num_computed, has_initial_state,
                       read_slots, write_slots, chunk_size, block_size, boundary_slots)  # fmt: skip
    T, HV = v.shape[0], v.shape[1]
    R = num_computed.shape[0]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    row = row_of_tokens(query_start_loc, T)
    live = row < R
    rowc = jnp.minimum(row, R - 1)
    first = live & (jnp.arange(T) == query_start_loc[rowc])
    init = read_initial(state, read_slots, has_initial_state)
    nb = 0 if boundary_slots is None else boundary_slots.shape[1]

    def body(carry, xs):
        s, final = carry
        t, qt, kt, vt, gt, bt = xs
        r = rowc[t]
        s = jnp.where(first[t], init[r], s)
        s, o = delta_step(
            s, qt, kt, vt.astype(jnp.float32), gt.astype(jnp.float32), bt.astype(jnp.float32)
        )
        final = final.at[r].set(jnp.where(live[t], s, final[r]))
        # per-token states are kept only when boundary states are asked for (memory: T x state)
        return (s, final), (jnp.where(live[t], o, 0.0), s if nb else None)

    xs = (jnp.arange(T), qf, kf, v, g, beta)
    (_, final), (o, per_token) = jax.lax.scan(body, (jnp.zeros_like(init[0]), init), xs)
    if nb:
        tok, hit = boundary_tokens(query_start_loc, num_computed, block_size, nb)
        slots = jnp.where(hit, boundary_slots, 0).reshape(-1)
        state = scatter_states(
            state, slots, per_token[jnp.clip(tok, 0, T - 1)].reshape((-1,) + per_token.shape[1:])
        )
    state = scatter_states(state, write_slots, final)
    return o.astype(v.dtype), state


def boundary_tokens(
    query_start_loc: jax.Array, num_computed: jax.Array, block_size: int, nb: int
) -> tuple[jax.Array, jax.Array]:
    """Flat token index [R, nb] after which row r's j-th block boundary falls, and whether it does.

    Boundary j of row r follows the token at absolute position (nc // bs + j + 1) * bs - 1.
    """
    nc = num_computed[:, None]
    p1 = (nc // block_size + 1 + jnp.arange(nb)[None, :]) * block_size
    length = (query_start_loc[1:] - query_start_loc[:-1])[:, None]
    hit = p1 <= nc + length
    return query_start_loc[:-1, None] + p1 - nc - 1, hit


def gdn_state_update_reference(
    q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots, *, scale=None, use_qk_l2norm=True
):
    """Gated DeltaNet decode with fused gating, token by token.

    q, k [B, L, HK, K]; v [B, L, HV, V]; a, b [B, L, HV]; A_log, dt_bias [HV]; state [S, HV, V, K];
    read_slots [B]; write_slots [B, L]. The state after lane t goes to write_slots[b, t] (when
    live); a lane whose write slot is not live (<= 0 or >= S) is dead and outputs 0.
    Returns (o [B, L, HV, V], state).
    """
    Bn, L, HK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    want = {
        "k": (k.shape, (Bn, L, HK, K)),
        "v": (v.shape, (Bn, L, HV, V)),
        "a": (a.shape, (Bn, L, HV)),
        "b": (b.shape, (Bn, L, HV)),
        "A_log": (A_log.shape, (HV,)),
        "dt_bias": (dt_bias.shape, (HV,)),
        "state": (state.shape[1:], (HV, V, K)),
        "read_slots": (read_slots.shape, (Bn,)),
        "write_slots": (write_slots.shape, (Bn, L)),
    }
    for name, (got, exp) in want.items():
        if tuple(got) != tuple(exp):
            raise ValueError(f"{name} has shape {tuple(got)}, expected {exp}")
    if HV % HK:
        raise ValueError(f"value heads HV={HV} must be a multiple of key heads HK={HK}")
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    s0 = read_initial(state, read_slots)

    def body(s, xs):
        qt, kt, vt, gt, bt = xs
        s, o = delta_step(s, qt, kt, vt.astype(jnp.float32), gt, bt)
        return s, (s, o)

    lanes = tuple(jnp.swapaxes(x, 0, 1) for x in (qf, kf, v, g, beta))
    _, (states, o) = jax.lax.scan(body, s0, lanes)  # [L, B, ...]
    live = live_slot(write_slots, state.shape[0])
    o = jnp.where(live[:, :, None, None], jnp.swapaxes(o, 0, 1), 0.0)
    flat = jnp.swapaxes(states, 0, 1).reshape((Bn * L,) + states.shape[2:])
    state = scatter_states(state, write_slots.reshape(-1), flat)
    return o.astype(v.dtype), state


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
    q,
    k,
    v,
    g,
    beta,
    state,
    query_start_loc,
    num_computed,
    has_initial_state,
    read_slots,
    write_slots,
    *,
    scale=None,
    use_qk_l2norm=True,
    chunk_size=64,
    block_size=None,
    boundary_slots=None,
):
    """Chunked (WY / UT-transform) form of `gdn_chunk_reference`; same arguments and results."""
    check_prefill_args(q, k, v, g, beta, state, query_start_loc, num_computed, has_initial_state,
                       read_slots, write_slots, chunk_size, block_size, boundary_slots)  # fmt: skip
    T, HV, V = v.shape
    R, C = num_computed.shape[0], chunk_size
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    init = read_initial(state, read_slots, has_initial_state)
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
    if nb:
        _, hit = boundary_tokens(query_start_loc, num_computed, block_size, nb)
        slots = jnp.where(hit, boundary_slots, 0).reshape(-1)
        state = scatter_states(state, slots, bounds.reshape((-1,) + bounds.shape[2:]))
    state = scatter_states(state, write_slots, final)
    return o.astype(v.dtype), state
