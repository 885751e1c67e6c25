"""Helpers shared by the recurrent-state ops: argument checks, slot handling, dt processing.

Slot convention (docs/architecture.md section 5): slot 0 of every state pool is NULL. A slot index
<= 0 means padding: it reads zeros and writes nothing. So does an index >= the pool size: on the
device an out-of-range gather would be clamped to a live row (and -1 wraps to the last), so every
slot read and write goes through `live_slot` / `safe_slot`, inside the kernels as well as in the
references.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NULL = 0


def check_shape(name: str, array: jax.Array | None, shape: Sequence[int | None]) -> None:
    """Raise ValueError unless `array` has `shape` (None matches any size)."""
    if array is None:
        return
    ok = len(array.shape) == len(shape) and all(
        want is None or got == want for got, want in zip(array.shape, shape, strict=True)
    )
    if not ok:
        raise ValueError(f"{name} has shape {tuple(array.shape)}; expected {tuple(shape)}")


def check_int(name: str, value: int, low: int, high: int | None = None) -> None:
    """Raise ValueError unless low <= value (<= high)."""
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value} must be in [{low}, {'inf' if high is None else high}]")


def check_tile_knobs(tuning, counts: Sequence[str] = ("num_stages",)) -> None:
    """Raise ValueError unless `tuning`'s block_m, block_n and block_k are powers of two >= 16
    (tensor-core dots need 16), its num_warps one of 1, 2, 4, 8, 16 and each field of `counts`
    >= 1: the launch knobs of the tiled matmul kernels."""
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(tuning, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name}={value} must be a power of two >= 16")
    if tuning.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={tuning.num_warps} must be one of 1, 2, 4, 8, 16")
    for name in counts:
        check_int(name, getattr(tuning, name), low=1)


# Decode launch order. CUDA runs a grid's first axis fastest, so the decode kernels list a row's
# tiles first and the rows last, grid (tiles, heads, rows): programs that run at the same time
# then read one slot's state in memory order. With the rows first they read B slots a state's
# stride apart (2 MiB per slot at the Qwen3-Next layer), and the fused and unfused decode paths
# took longer (benchmarks/results/README.md).


def live_slot(slots: jax.Array, num_slots: int) -> jax.Array:
    """True where a slot index names a real slot: NULL < slot < num_slots (works in kernels)."""
    return (slots > NULL) & (slots < num_slots)


def safe_slot(slots: jax.Array, num_slots: int) -> jax.Array:
    """`slots` where live, NULL elsewhere: an index that can never reach past the pool."""
    return jnp.where(live_slot(slots, num_slots), slots, NULL)


def gather_slots(pool: jax.Array, slots: jax.Array, use: jax.Array | bool = True) -> jax.Array:
    """Rows `pool[slots]` in fp32; zeros where the slot is not live (<= 0, >= S) or `use` is False.

    Selects with `where` (never multiplies by a mask) so a NaN in the NULL slot cannot leak.
    """
    rows = pool[safe_slot(slots, pool.shape[0])].astype(jnp.float32)
    keep = live_slot(slots, pool.shape[0]) & use
    keep = keep.reshape(keep.shape + (1,) * (rows.ndim - keep.ndim))
    return jnp.where(keep, rows, 0.0)


def scatter_slots(pool: jax.Array, slots: jax.Array, rows: jax.Array) -> jax.Array:
    """`pool[slots] = rows` for live slots; other slots (<= 0 or >= S) write nothing (drop mode)."""
    target = jnp.where(live_slot(slots, pool.shape[0]), slots, pool.shape[0]).reshape(-1)
    rows = rows.reshape((-1,) + pool.shape[1:]).astype(pool.dtype)
    return pool.at[target].set(rows, mode="drop")


def token_rows(query_start_loc: jax.Array, num_tokens: int) -> tuple[jax.Array, jax.Array]:
    """For each flat token: the row that owns it (int32 [T]) and whether it is live (bool [T])."""
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    row = jnp.searchsorted(query_start_loc, t, side="right").astype(jnp.int32) - 1
    num_rows = query_start_loc.shape[0] - 1
    live = t < query_start_loc[num_rows]
    return jnp.clip(row, 0, num_rows - 1), live


def process_dt(
    dt: jax.Array,
    dt_bias: jax.Array | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
) -> jax.Array:
    """dt' = clamp(softplus(dt + dt_bias) if dt_softplus else dt + dt_bias, *dt_limit), fp32."""
    dt = dt.astype(jnp.float32)
    if dt_bias is not None:
        dt = dt + dt_bias.astype(jnp.float32)
    if dt_softplus:
        dt = jax.nn.softplus(dt)
    low, high = dt_limit
    if low > 0.0 or high != float("inf"):
        dt = jnp.clip(dt, low, high)
    return dt


def dt_activation(dt: jax.Array, dt_softplus: bool, dt_limit: tuple[float, float]) -> jax.Array:
    """In-kernel dt activation: softplus (linear above 20), then the dt_limit clamp."""
    if dt_softplus:  # softplus, linear above 20 as in the reference implementations
        dt = jnp.where(dt > 20.0, dt, jnp.log1p(jnp.exp(jnp.minimum(dt, 20.0))))
    low, high = dt_limit
    if low > 0.0 or high != float("inf"):
        dt = jnp.clip(dt, low, high)
    return dt


def silu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)


def pow2(n: int) -> int:
    """Smallest power of two >= n (at least 1): Triton block sizes must be powers of two."""
    return int(pl.next_power_of_2(max(int(n), 1)))


def sds_like(
    a: jax.Array, shape: tuple[int, ...] | None = None, dtype=None
) -> jax.ShapeDtypeStruct:
    """Output shape for pallas_call (`a`'s shape and dtype unless given) that keeps shard_map's
    varying axes of `a` (harmless outside it)."""
    return jax.ShapeDtypeStruct(
        a.shape if shape is None else shape,
        a.dtype if dtype is None else dtype,
        manual_axis_type=jax.typeof(a).manual_axis_type,
    )


def fused_decode_dims(
    mixed_name: str, mixed, state_name: str, state, conv_weight
) -> tuple[int, int, int, int]:
    """First checks of a fused decode op (conv + state update reading a projection's output):
    mixed [B, L, columns], state [S, 4 dims], conv_weight [C, W] with W >= 2. Returns (B, L, C, W);
    the op derives its head geometry from them, then calls `check_fused_decode_pools`."""
    check_shape(mixed_name, mixed, (None, None, None))
    check_shape(state_name, state, (None, None, None, None))
    check_shape("conv_weight", conv_weight, (None, None))
    conv_dim, width = conv_weight.shape
    if width < 2:
        raise ValueError(f"conv_weight has width {width}; the decode update needs d_conv >= 2")
    return *mixed.shape[:2], conv_dim, width


def check_fused_decode_pools(
    state, conv_bias, conv_state, read_slots, write_slots, dims: tuple[int, int, int, int]
) -> None:
    """The rest of a fused decode op's shared checks, `dims` = `fused_decode_dims(...)`: conv_bias
    [C] or None, conv_state [S, C, W - 1], read_slots [B], write_slots [B, L]."""
    batch, lanes, conv_dim, width = dims
    check_shape("conv_bias", conv_bias, (conv_dim,))
    check_shape("conv_state", conv_state, (state.shape[0], conv_dim, width - 1))
    check_shape("read_slots", read_slots, (batch,))
    check_shape("write_slots", write_slots, (batch, lanes))


def lower_for_cuda(fn, *args, device_kind: str = "NVIDIA H100 80GB HBM3", num_cores: int = 132):
    """Lower `fn(*args)` for CUDA on a machine without a GPU; returns the StableHLO text.

    This runs the Pallas -> Triton IR lowering (catches non-power-of-two blocks, bad indexing) but
    not the PTX compile. `args` may be jax.ShapeDtypeStruct.
    """
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    device = AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform="gpu")
    with use_abstract_mesh(AbstractMesh((1,), ("_",), abstract_device=device)):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def store_boundary_state(pool_ref, boundary_ref, row, end, pos0, block_size, index, value, mask):
    """Prefix caching inside a scan kernel: when a chunk ends on a block boundary (absolute position
    `end`, the row starting at `pos0`), store `value` to the row's slot for that boundary.

    `index` is the (head, P slice, N slice) part of the pool index; a slot that is not live
    (<= 0 or >= S) writes nothing.
    """
    j = end // block_size - pos0 // block_size - 1
    slot = boundary_ref[row, jnp.clip(j, 0, boundary_ref.shape[1] - 1)]
    hit = (end % block_size == 0) & (j < boundary_ref.shape[1]) & live_slot(slot, pool_ref.shape[0])
    plgpu.store(
        pool_ref.at[(jnp.where(hit, slot, NULL), *index)],
        value.astype(pool_ref.dtype),
        mask=mask & hit,
    )


def loads_before_stores(on_gpu: bool) -> None:
    """A barrier of the program's threads between its loads of a pool entry and its stores into
    the same entry (a decode row updated in place: read slot = write slot). Triton may hold one
    element of a short vector in several warps; without the barrier a warp that stores early
    changes what a slower warp still has to load (seen on the H100: the fused Mamba2 decode's
    in-place row was off by 2e-2 in bf16). Interpret mode runs each program alone: no barrier."""
    if on_gpu:
        plgpu.debug_barrier()


def conv_update_lanes(
    read_ref,
    write_ref,
    x_ref,
    w_ref,
    bias_ref,
    state_ref,
    *,
    row,
    channel,
    column,
    mask,
    lanes,
    width,
    dtype,
    on_gpu: bool,
) -> list[jax.Array]:
    """In a decode kernel: silu(causal conv) of one channel block of decode row `row` for
    every lane, fp32 rounded to `dtype` as an unfused conv would store it (0 on dead lanes); stores
    the window after each lane to that lane's write slot in `state_ref` [S, channels, W - 1].

    `channel` is the block's pl.ds into the conv channels, `column` the same block in the input
    x_ref [B, L, columns] (a projection holding the channels among other columns). The whole
    window is loaded, by every thread (`loads_before_stores`), before the first store: lane 0 may
    write its own read slot.
    """
    num_slots = state_ref.shape[0]
    read = read_ref[row]
    seq = [
        plgpu.load(
            state_ref.at[safe_slot(read, num_slots), channel, jnp.int32(k)],
            mask=mask & live_slot(read, num_slots),
            other=0.0,
        ).astype(jnp.float32)
        for k in range(width - 1)
    ]
    loads_before_stores(on_gpu)
    taps = [
        plgpu.load(w_ref.at[channel, jnp.int32(j)], mask=mask, other=0.0).astype(jnp.float32)
        for j in range(width)
    ]
    bias = plgpu.load(bias_ref.at[channel], mask=mask, other=0.0).astype(jnp.float32)
    outs = []
    for t in range(lanes):
        tt = jnp.int32(t)  # a traced index (interpret mode rejects Python ints in .at[])
        seq.append(plgpu.load(x_ref.at[row, tt, column], mask=mask, other=0.0).astype(jnp.float32))
        acc = bias
        for j in range(width):
            acc = acc + taps[j] * seq[t + j]
        write = write_ref[row, tt]
        writes = live_slot(write, num_slots)
        outs.append(jnp.where(writes, silu(acc), 0.0).astype(dtype).astype(jnp.float32))
        for k in range(width - 1):
            plgpu.store(
                state_ref.at[safe_slot(write, num_slots), channel, jnp.int32(k)],
                seq[t + 1 + k].astype(state_ref.dtype),
                mask=mask & writes,
            )
    return outs
