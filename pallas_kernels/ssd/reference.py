"""Plain-jnp references of the Mamba2 SSD ops, and the input checks they share with the kernels.

Glossary (Mamba-2 paper, arXiv 2405.21060): T flat tokens, R prefill rows, B decode rows of
L = 1 + K lanes, H heads, P head dim, G groups (head h uses group h // (H // G)), N state size,
S state slots, W conv width. Per head the state s is [P, N]:
    dt' = clamp(softplus(dt + dt_bias), *dt_limit)
    s   = exp(dt' A) s + dt' x B^T          (x: [P], B: [N])
    y   = s C + D x, gated by silu(z)        (C: [N])

- `ssd_chunk_scan_reference`: prefill over ragged `Rows`, one token at a time;
- `ssd_state_update_reference`: decode over 1 + K lanes, the state after lane t to its own slot;
- `mamba2_decode_reference`: the decode step the model runs, the causal conv update followed by
  the state update, both reading in_proj's output.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels._common import (
    check_fused_decode_pools,
    check_int,
    check_shape,
    fused_decode_dims,
    gather_slots,
    live_slot,
    process_dt,
    scatter_slots,
    silu,
    token_rows,
)
from pallas_kernels.conv.reference import causal_conv1d_update_reference
from pallas_kernels.rows import Rows

ALGORITHMS = ("sequential", "parallel")


def _check_heads(x, dt, A, B, C, ssm_state, D, z, dt_bias, lead: tuple[int, ...]) -> None:
    """x [*lead, H, P], dt [*lead, H], B and C [*lead, G, N], ssm_state [S, H, P, N], A / D /
    dt_bias [H], z like x; G divides H."""
    heads, head_dim = x.shape[len(lead)], x.shape[len(lead) + 1]
    groups, state_size = B.shape[-2], B.shape[-1]
    check_shape("dt", dt, (*lead, heads))
    check_shape("A", A, (heads,))
    check_shape("B", B, (*lead, None, None))
    check_shape("C", C, (*lead, groups, state_size))
    check_shape("ssm_state", ssm_state, (None, heads, head_dim, state_size))
    check_shape("D", D, (heads,))
    check_shape("z", z, x.shape)
    check_shape("dt_bias", dt_bias, (heads,))
    if groups < 1 or heads % groups:
        raise ValueError(f"B has {groups} groups; must divide the {heads} heads of x")


def check_scan_args(
    x, dt, A, B, C, ssm_state, rows: Rows, D, z, dt_bias, chunk_size: int, algorithm: str
) -> tuple[int, int, int, int, int, int]:
    """Validate the prefill scan's shapes and options (arguments in the op's order); return
    (T, H, P, G, N, R)."""
    num_tokens, heads, head_dim = x.shape
    _check_heads(x, dt, A, B, C, ssm_state, D, z, dt_bias, (num_tokens,))
    check_int("chunk_size", chunk_size, 1)
    num_rows = rows.check(chunk_size)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} must be one of {ALGORITHMS}")
    return num_tokens, heads, head_dim, B.shape[1], B.shape[2], num_rows


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit", "chunk_size", "algorithm"))
def ssd_chunk_scan_reference(
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
    """The definition, one token at a time. x [T, H, P] -> (y [T, H, P], ssm_state [S, H, P, N]).

    One lax.scan over the flat tokens carries the state, resets it to the row's initial state at
    each row start, and writes the final state (and the block-boundary states) into the pool as it
    goes.
    `chunk_size` and `algorithm` (which kernel runs on the GPU) do not change the result of this
    definition; they are only validated.
    """
    num_tokens, heads, _, groups, _, _ = check_scan_args(
        x, dt, A, B, C, ssm_state, rows, D, z, dt_bias, chunk_size, algorithm
    )
    qsl, num_computed, write_slots = rows.query_start_loc, rows.num_computed, rows.write_slots
    block_size, boundary_slots = rows.block_size, rows.boundary_slots
    rep = heads // groups
    init = gather_slots(ssm_state, rows.read_slots, rows.has_initial_state)  # [R, H, P, N]
    lengths = qsl[1:] - qsl[:-1]
    # Rows without tokens still publish their (initial) state.
    pool = scatter_slots(ssm_state, jnp.where(lengths == 0, write_slots, 0), init)

    row, live = token_rows(qsl, num_tokens)
    local = jnp.arange(num_tokens, dtype=jnp.int32) - qsl[row]
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


def check_update_args(x, dt, A, B, C, ssm_state, read_slots, write_slots, D, z, dt_bias):
    """Validate the decode update's shapes; return (B, L, H, P, G, N)."""
    batch, lanes, heads, head_dim = x.shape
    _check_heads(x, dt, A, B, C, ssm_state, D, z, dt_bias, (batch, lanes))
    check_shape("read_slots", read_slots, (batch,))
    check_shape("write_slots", write_slots, (batch, lanes))
    return batch, lanes, heads, head_dim, B.shape[2], B.shape[3]


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit"))
def ssd_state_update_reference(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[jax.Array, jax.Array]:
    """x [B, L, H, P], dt [B, L, H], B/C [B, L, G, N], ssm_state [S, H, P, N] -> (y, ssm_state).

    The state before lane 0 is ssm_state[read_slots[b]] (zeros when the slot is not live: <= 0 or
    >= S). The state after lane t goes to write_slots[b, t]; lanes whose write slot is not live
    output 0 and write nothing.
    """
    _, lanes, heads, _, groups, _ = check_update_args(
        x, dt, A, B, C, ssm_state, read_slots, write_slots, D, z, dt_bias
    )
    rep = heads // groups
    s = gather_slots(ssm_state, read_slots)  # [B, H, P, N]
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit)  # [B, L, H]
    a = A.astype(jnp.float32)
    d_skip = jnp.zeros((heads,), jnp.float32) if D is None else D.astype(jnp.float32)
    ys, states = [], []
    for t in range(lanes):
        xt = x[:, t].astype(jnp.float32)  # [B, H, P]
        bt = jnp.repeat(B[:, t].astype(jnp.float32), rep, axis=1)  # [B, H, N]
        ct = jnp.repeat(C[:, t].astype(jnp.float32), rep, axis=1)
        decay = jnp.exp(dtp[:, t] * a)[:, :, None, None]
        s = decay * s + (dtp[:, t, :, None] * xt)[..., None] * bt[:, :, None, :]
        y = jnp.einsum("bhpn,bhn->bhp", s, ct, precision="highest") + d_skip[:, None] * xt
        if z is not None:
            y = y * silu(z[:, t].astype(jnp.float32))
        ys.append(y)
        states.append(s)
    y = jnp.stack(ys, axis=1)
    live = live_slot(write_slots, ssm_state.shape[0])
    y = jnp.where(live[:, :, None, None], y, 0.0).astype(x.dtype)
    return y, scatter_slots(ssm_state, write_slots, jnp.stack(states, axis=1))


class Geometry(NamedTuple):
    """The fused decode's dimensions: d_inner = H P columns of x, conv_dim = d_inner + 2 G N."""

    batch: int
    lanes: int
    heads: int
    head_dim: int
    groups: int
    state_size: int
    width: int

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def bc_dim(self) -> int:  # the B and C columns of xBC
        return 2 * self.groups * self.state_size

    @property
    def conv_dim(self) -> int:
        return self.d_inner + self.bc_dim


def check_decode_args(
    zxbcdt, conv_weight, conv_bias, conv_state, ssm_state, A, read_slots, write_slots, D, dt_bias
) -> Geometry:
    """Validate the fused decode's shapes; the geometry comes from ssm_state (H, P, N) and
    conv_weight (C, W)."""
    dims = fused_decode_dims("zxbcdt", zxbcdt, "ssm_state", ssm_state, conv_weight)
    batch, lanes, conv_dim, width = dims
    _, heads, head_dim, state_size = ssm_state.shape
    bc_dim = conv_dim - heads * head_dim
    if bc_dim <= 0 or bc_dim % (2 * state_size):
        raise ValueError(
            f"conv_weight has {conv_dim} channels; expected H*P + 2*G*N = {heads * head_dim} + a "
            f"positive multiple of {2 * state_size} (ssm_state has shape {tuple(ssm_state.shape)})"
        )
    groups = bc_dim // (2 * state_size)
    if heads % groups:
        raise ValueError(f"conv_weight implies {groups} groups; must divide the {heads} heads")
    geo = Geometry(batch, lanes, heads, head_dim, groups, state_size, width)
    check_shape("zxbcdt", zxbcdt, (batch, lanes, geo.d_inner + conv_dim + heads))
    check_fused_decode_pools(ssm_state, conv_bias, conv_state, read_slots, write_slots, dims)
    for name, a in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_shape(name, a, (heads,))
    return geo


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit"))
def mamba2_decode_reference(
    zxbcdt: jax.Array,
    conv_weight: jax.Array,
    conv_bias: jax.Array | None,
    conv_state: jax.Array,
    ssm_state: jax.Array,
    A: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The unfused composition of the decode step (see `ssd/decode.py` for the operands):
    zxbcdt [B, L, d_inner + conv_dim + H] -> (y [B, L, H, P], conv_state, ssm_state).

    1. Split zxbcdt's columns into xBC and dt (z is not used).
    2. xBC = silu(causal conv of the window ++ xBC), windows written per lane.
    3. Split xBC into x [B, L, H, P], B and C [B, L, G, N].
    4. The selective state update lane by lane, states written per lane.
    """
    geo = check_decode_args(
        zxbcdt,
        conv_weight,
        conv_bias,
        conv_state,
        ssm_state,
        A,
        read_slots,
        write_slots,
        D,
        dt_bias,
    )
    lead = zxbcdt.shape[:2]
    xbc = zxbcdt[..., geo.d_inner : geo.d_inner + geo.conv_dim]
    dt = zxbcdt[..., geo.d_inner + geo.conv_dim :]
    xbc, conv_state = causal_conv1d_update_reference(
        xbc, conv_weight, conv_bias, conv_state, read_slots, write_slots, activation="silu"
    )
    x, b, c = jnp.split(xbc, [geo.d_inner, geo.d_inner + geo.bc_dim // 2], axis=-1)
    y, ssm_state = ssd_state_update_reference(
        x.reshape(*lead, geo.heads, geo.head_dim),
        dt,
        A,
        b.reshape(*lead, geo.groups, geo.state_size),
        c.reshape(*lead, geo.groups, geo.state_size),
        ssm_state,
        read_slots,
        write_slots,
        D=D,
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        dt_limit=dt_limit,
    )
    return y, conv_state, ssm_state
