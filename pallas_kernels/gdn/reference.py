"""Plain-jnp references of the Gated DeltaNet ops (fp32, static shapes), and the input checks they
share with the kernels.

Glossary: T flat tokens, R prefill rows, B decode rows of L = 1 + K lanes, HK key heads, HV value
heads (value head hv reads key head hv // (HV // HK)), K / V key / value head dims, S state
slots. Per value head the state S is [V, K] (V-first); q and k are l2-normalised (with
use_qk_l2norm) and q is scaled (K^-1/2 by default):
    S = S * exp(g);  delta = beta * (v - S @ k);  S = S + outer(delta, k);  o = S @ q

- `gdn_chunk_reference`: prefill over ragged `Rows`, token by token (the definition; what CI
  compares against). Its chunked WY form, the math of the kernel, is in `reference_chunked.py`;
- `gdn_state_update_reference`: decode over 1 + K lanes with the gating fused, the state after
  lane t to its own slot;
- `gdn_decode_reference`: the decode step the model runs, the causal conv update of qkv followed
  by the state update, both reading in_proj's output.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels._common import (
    check_fused_decode_pools,
    check_shape,
    fused_decode_dims,
    live_slot,
    safe_slot,
)
from pallas_kernels.conv.reference import causal_conv1d_update_reference
from pallas_kernels.rows import Rows

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


def check_chunk_args(q, k, v, g, beta, state, rows: Rows, chunk_size: int) -> int:
    """Raise ValueError naming the first argument whose shape breaks the gdn_chunk contract;
    return R."""
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    want = {
        "k": (k.shape, (T, HK, K)),
        "v": (v.shape, (T, HV, V)),
        "g": (g.shape, (T, HV)),
        "beta": (beta.shape, (T, HV)),
        "state": (state.shape[1:], (HV, V, K)),
    }
    for name, (got, exp) in want.items():
        if tuple(got) != tuple(exp):
            raise ValueError(f"{name} has shape {tuple(got)}, expected {exp}")
    if HV % HK:
        raise ValueError(f"value heads HV={HV} must be a multiple of key heads HK={HK}")
    if chunk_size <= 0 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size={chunk_size} must be a positive power of two")
    return rows.check(chunk_size)


def row_of_tokens(query_start_loc: jax.Array, T: int) -> jax.Array:
    """Row index of each flat token [T]; R for padding tokens."""
    return jnp.searchsorted(query_start_loc[1:], jnp.arange(T), side="right").astype(jnp.int32)


def gdn_chunk_reference(
    q, k, v, g, beta, state, rows: Rows, *, scale=None, use_qk_l2norm=True, chunk_size=64
):
    """Token-by-token Gated DeltaNet prefill (the definition) over ragged `Rows`.

    q, k [T, HK, K]; v [T, HV, V]; g, beta [T, HV]; state [S, HV, V, K]. Returns (o [T, HV, V] in
    v.dtype, updated state pool). `chunk_size` does not change the result of this definition; it
    is only validated (boundary states need block_size to be a multiple of it).
    """
    R = check_chunk_args(q, k, v, g, beta, state, rows, chunk_size)
    query_start_loc, boundary_slots = rows.query_start_loc, rows.boundary_slots
    T, HV = v.shape[0], v.shape[1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    row = row_of_tokens(query_start_loc, T)
    live = row < R
    rowc = jnp.minimum(row, R - 1)
    first = live & (jnp.arange(T) == query_start_loc[rowc])
    init = read_initial(state, rows.read_slots, rows.has_initial_state)
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
    if nb and boundary_slots is not None:  # nb > 0: there are boundary slots
        tok, hit = boundary_tokens(rows, nb)
        slots = jnp.where(hit, boundary_slots, 0).reshape(-1)
        state = scatter_states(
            state, slots, per_token[jnp.clip(tok, 0, T - 1)].reshape((-1,) + per_token.shape[1:])
        )
    state = scatter_states(state, rows.write_slots, final)
    return o.astype(v.dtype), state


def boundary_tokens(rows: Rows, nb: int) -> tuple[jax.Array, jax.Array]:
    """Flat token index [R, nb] after which row r's j-th block boundary falls, and whether it does.

    Boundary j of row r follows the token at absolute position (nc // bs + j + 1) * bs - 1.
    """
    query_start_loc, block_size = rows.query_start_loc, rows.need_block_size()
    nc = rows.num_computed[:, None]
    p1 = (nc // block_size + 1 + jnp.arange(nb)[None, :]) * block_size
    length = (query_start_loc[1:] - query_start_loc[:-1])[:, None]
    hit = p1 <= nc + length
    return query_start_loc[:-1, None] + p1 - nc - 1, hit


def check_update_args(q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots) -> None:
    """Raise ValueError naming the first argument whose shape breaks the gdn_state_update
    contract."""
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


def gdn_state_update_reference(
    q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots, *, scale=None, use_qk_l2norm=True
):
    """Gated DeltaNet decode with fused gating, token by token.

    q, k [B, L, HK, K]; v [B, L, HV, V]; a, b [B, L, HV]; A_log, dt_bias [HV]; state [S, HV, V, K];
    read_slots [B]; write_slots [B, L]. The state after lane t goes to write_slots[b, t] (when
    live); a lane whose write slot is not live (<= 0 or >= S) is dead and outputs 0.
    Returns (o [B, L, HV, V], state).
    """
    check_update_args(q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots)
    Bn, L = q.shape[:2]
    HV = v.shape[2]
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


class Geometry(NamedTuple):
    """The fused decode's dimensions: key_dim = HK K, value_dim = HV V, conv_dim = 2 key_dim +
    value_dim."""

    batch: int
    lanes: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    width: int

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def check_decode_args(
    mixed, conv_weight, conv_bias, conv_state, state, A_log, dt_bias, read_slots, write_slots
) -> Geometry:
    """Validate shapes; the geometry comes from state (HV, V, K) and conv_weight (C, W)."""
    dims = fused_decode_dims("mixed", mixed, "state", state, conv_weight)
    batch, lanes, conv_dim, width = dims
    _, v_heads, v_dim, k_dim = state.shape
    key_dim2 = conv_dim - v_heads * v_dim
    if key_dim2 <= 0 or key_dim2 % (2 * k_dim):
        raise ValueError(
            f"conv_weight has {conv_dim} channels; expected 2*HK*K + HV*V = 2*HK*{k_dim} + "
            f"{v_heads * v_dim} (state has shape {tuple(state.shape)})"
        )
    k_heads = key_dim2 // (2 * k_dim)
    if v_heads % k_heads:
        raise ValueError(f"conv_weight implies {k_heads} key heads; must divide HV={v_heads}")
    geo = Geometry(batch, lanes, k_heads, v_heads, k_dim, v_dim, width)
    check_shape("mixed", mixed, (batch, lanes, conv_dim + geo.value_dim + 2 * v_heads))
    check_fused_decode_pools(state, conv_bias, conv_state, read_slots, write_slots, dims)
    check_shape("A_log", A_log, (v_heads,))
    check_shape("dt_bias", dt_bias, (v_heads,))
    return geo


@functools.partial(jax.jit, static_argnames=("scale", "use_qk_l2norm"))
def gdn_decode_reference(
    mixed: jax.Array,
    conv_weight: jax.Array,
    conv_bias: jax.Array | None,
    conv_state: jax.Array,
    state: jax.Array,
    A_log: jax.Array,
    dt_bias: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The unfused composition of the decode step (see `gdn/decode.py` for the operands):
    mixed [B, L, conv_dim + value_dim + 2 HV] -> (o [B, L, HV, V], conv_state, state).

    1. Split mixed's columns into qkv, b and a (z is not used).
    2. qkv = silu(causal conv of the window ++ qkv), windows written per lane.
    3. Split qkv into q, k [B, L, HK, K] and v [B, L, HV, V].
    4. The gated delta rule lane by lane (l2norm, gates), states written per lane.
    """
    geo = check_decode_args(
        mixed, conv_weight, conv_bias, conv_state, state, A_log, dt_bias, read_slots, write_slots
    )
    lead = mixed.shape[:2]
    gates = geo.conv_dim + geo.value_dim
    qkv = mixed[..., : geo.conv_dim]
    b, a = mixed[..., gates : gates + geo.v_heads], mixed[..., gates + geo.v_heads :]
    qkv, conv_state = causal_conv1d_update_reference(
        qkv, conv_weight, conv_bias, conv_state, read_slots, write_slots, activation="silu"
    )
    q, k, v = jnp.split(qkv, [geo.key_dim, 2 * geo.key_dim], axis=-1)
    o, state = gdn_state_update_reference(
        q.reshape(*lead, geo.k_heads, geo.k_dim),
        k.reshape(*lead, geo.k_heads, geo.k_dim),
        v.reshape(*lead, geo.v_heads, geo.v_dim),
        a,
        b,
        A_log,
        dt_bias,
        state,
        read_slots,
        write_slots,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    return o, conv_state, state
