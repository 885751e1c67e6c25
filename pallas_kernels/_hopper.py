"""What the Mosaic GPU kernels (`ssd/sequential_mgpu.py`, `gdn/chain_mgpu.py`) share: where they
run, how their operands reach them and how a call binds, and the SMEM tiles, the memory
warpgroup's stage loop and the stores of programs that walk a row's chunks of Q tokens.

Mosaic GPU asks more of its operands than the Triton lowering: each aligned to 256 bytes (XLA
promises that for its own buffers only: `own_buffers`, `boundary_operands`), and tiles that TMA
fills and wgmma reads swizzled in SMEM (`swizzled_smem`).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def on_hopper() -> bool:
    """Whether the default device is an sm_90 GPU (wgmma is sm_90a only): where the Mosaic GPU
    kernels run."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", "") == "9.0"


def boundary_operands(bounds: jax.Array, block_size: int | None) -> tuple[jax.Array, ...]:
    """A Mosaic GPU kernel's boundary-slot operand: the table when the call caches states, else
    none (the NULL table of a call without caching is a constant, and XLA aligns constants to
    less than the 256 bytes Mosaic GPU asks of every operand; see `own_buffers`)."""
    return () if block_size is None else (bounds,)


def own_buffers(*operands: jax.Array) -> tuple[jax.Array, ...]:
    """A Mosaic GPU kernel's small int32 operands (offsets, counts, slots), each computed into a
    buffer of its own.

    Mosaic GPU refuses an operand that is not aligned to 256 bytes, and XLA passes a contiguous
    slice of a larger array as a view into it at the slice's offset: the engine's step inputs
    are slices of one packed array, and the boundary slots of a Qwen3-Next step reached the
    Gated DeltaNet chain 64 bytes into it ("Input buffer 7 is not 256-byte aligned", H100,
    2026-11-28). A maximum with 0, which XLA cannot fold away and which changes no valid value
    (slots, offsets and counts are >= 0; a negative slot means padding, as NULL does), makes
    each the output of a fusion, and XLA aligns those to 256 bytes.
    """
    return tuple(jnp.maximum(a, 0) for a in operands)


def call_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A call of an op as its kernel's `supports` reads it: every argument by name, defaults
    filled in (the models pass some positionally, some by keyword)."""
    call = signature.bind(*args, **kwargs)
    call.apply_defaults()
    return call.arguments


def split_operands(refs: tuple, count: int, block_size: int | None) -> tuple:
    """(the first `count` refs, the boundary-slot ref or None, the refs after them): a kernel's
    int32 operands, then the boundary slots only when the call caches states
    (`boundary_operands`)."""
    if block_size is None:
        return refs[:count], None, refs[count:]
    return refs[:count], refs[count], refs[count + 1 :]


def swizzled_smem(shape: tuple[int, ...], dtype, stages: int | None = None) -> pl.MemoryRef:
    """A tiled, 128-byte swizzled SMEM buffer (`stages` of them): what TMA fills and wgmma reads."""
    elems = 128 // jnp.dtype(dtype).itemsize
    # jax declares the transforms' base `Transform` a Protocol whose placeholder methods mypy
    # reads as abstract; these two implement what a tiling and a swizzle need.
    transforms = (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(128))  # type: ignore[abstract]
    return plgpu.SMEM(shape if stages is None else (stages, *shape), dtype, transforms=transforms)


def fill_stages(num_chunks: jax.Array, stages: int, consumed, fetch, registers: int) -> None:
    """The memory warpgroup: `fetch(k, slot)` each chunk k of the row into stage k % stages, once
    the compute warpgroup has released that stage (`consumed`), with `registers` registers a
    thread (the rest go to the compute warpgroup)."""
    plgpu.set_max_registers(registers, action="decrease")

    @pl.loop(0, num_chunks)
    def _(k):
        slot = lax.rem(k, stages)

        @pl.when(k >= stages)
        def _():
            plgpu.barrier_wait(consumed.at[slot])

        fetch(k, slot)


def store_rows(src, dst, index: tuple, t0: jax.Array, n: jax.Array) -> None:
    """TMA-store the first n rows of the SMEM tile `src` to rows t0.. of `dst` at `index` (the
    axes after the token axis): the whole tile when n fills it, else row by row (never past n:
    another program owns the rows after)."""
    size = src.shape[0]

    @pl.when(n == size)
    def _():
        plgpu.copy_smem_to_gmem(src, dst.at[(pl.ds(t0, size), *index)])

    @pl.when(n < size)
    def _():
        @pl.loop(0, n)
        def _(t):
            plgpu.copy_smem_to_gmem(src.at[pl.ds(t, 1)], dst.at[(pl.ds(t0 + t, 1), *index)])


def store_state(state: jax.Array, buffer, pool, index: tuple, live: jax.Array) -> None:
    """The fp32 state (registers) to `pool` at `index` through the SMEM `buffer`, when `live`."""

    @pl.when(live)
    def _():
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the buffer's last store has read it
        buffer[...] = state
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(buffer, pool.at[index])


def load_state(buffer, copy, live: jax.Array) -> jax.Array:
    """The fp32 state from the SMEM `buffer` into registers (the wgmma accumulator layout), zeros
    unless the slot it came from is `live`; its bf16 / fp16 copy goes to `copy`, for the chunk's
    first wgmma."""
    state = plgpu.load(buffer, layout=plgpu.Layout.WGMMA)
    live = jnp.full(state.shape, live)  # no scalar broadcasts in warpgroup code
    state = jnp.where(plgpu.layout_cast(live, plgpu.Layout.WGMMA), state, 0.0)
    copy[...] = state.astype(copy.dtype)
    plgpu.commit_smem()
    return state


def zero_padding(tile, dst, index: tuple, qsl, num_rows: int, num_tokens: int) -> None:
    """Zero rows qsl[num_rows] .. num_tokens of `dst` at `index` (the padding tokens, which no row
    owns), a tile's rows at a time, through the SMEM `tile`."""
    size = tile.shape[0]
    tile[...] = plgpu.layout_cast(jnp.zeros(tile.shape, tile.dtype), plgpu.Layout.WGMMA)
    plgpu.commit_smem()
    pad0 = qsl[num_rows]

    @pl.loop(0, pl.cdiv(num_tokens - pad0, size))
    def _(k):
        t0 = pad0 + k * size
        store_rows(tile, dst, index, t0, jnp.minimum(size, num_tokens - t0))

    plgpu.wait_smem_to_gmem(0)
