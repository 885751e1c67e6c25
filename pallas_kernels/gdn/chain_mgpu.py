"""The Gated DeltaNet prefill chain for Hopper, in Mosaic GPU (kernel 2 of `gdn/chunk.py`).

`ops.gdn_chunk` runs it on an sm_90 GPU wherever `supports` holds (bf16 / fp16 inputs, K 64 or
128, V a multiple of BV, chunk size Q, an fp32 pool); the Triton chain elsewhere. The SSD scan's
Mosaic kernel (`ssd/sequential_mgpu.py`) is its template. Mosaic GPU's interpret mode does not run
wgmma, so its math is checked on the GPU only (gpu_checks.py's `gdn_chunk hopper` points).

Kernel 1 (`gdn/intra.py`, Triton) writes per chunk the tiles W, KD, QE [C, K], U [C, V] and
AQK [C, C], whole and finite (zeros on a chunk's rows past its tokens). This kernel walks a row's
chunks with the state slice S [BV, K] (V-first, as the pool stores it) in fp32 registers:

    warpgroup 1 (memory)   TMA of chunk j + 2's tiles (aligned: a tile is indexed by its chunk)
    warpgroup 0 (compute)  per chunk of n tokens:
                           1. v_new = U - W S^T                        (wgmma, S^T a bf16 copy)
                           2. o = QE S^T + AQK v_new   ->  TMA store of the chunk's n tokens
                           3. S = exp(g_total) S + v_new^T KD          (wgmma into S)

Grid (value heads, V / BV, R + 1); program row R zeroes the padding tokens. g_total, the
chunk's summed log decay, comes from XLA ([chunks, HV]).
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels._common import live_slot, safe_slot
from pallas_kernels._hopper import (
    boundary_operands,
    call_arguments,
    fill_stages,
    load_state,
    on_hopper,
    own_buffers,
    split_operands,
    store_rows,
    store_state,
    swizzled_smem,
    zero_padding,
)
from pallas_kernels.gdn.chunk import ChunkTuning, chunk_tiles, intra_spec
from pallas_kernels.gdn.intra import intra_tiles
from pallas_kernels.gdn.reference import check_chunk_args
from pallas_kernels.rows import Rows

Q = 64  # tokens a chunk (the models' GDN chunk size): the M of the wgmmas
BV = 64  # V rows of the state a program holds
STAGES = 2
K_DIMS = (64, 128)  # what the register budget and wgmma tiles take


def chunk_totals(g: jax.Array, chunk_start: jax.Array, chunk_len: jax.Array) -> jax.Array:
    """[NC, HV] fp32: each chunk's summed log decay, over its own tokens in a fixed order."""
    lanes = jnp.arange(Q, dtype=jnp.int32)
    token = jnp.minimum(chunk_start[:, None] + lanes, g.shape[0] - 1)
    rows = jnp.where((lanes < chunk_len[:, None])[..., None], g.astype(jnp.float32)[token], 0.0)
    return jnp.sum(rows, axis=1)


def gdn_chain_mgpu(
    meta: tuple[jax.Array, ...],
    totals: jax.Array,
    tiles: tuple[jax.Array, ...],
    state: jax.Array,
    num_tokens: int,
    v_dtype,
    block_size: int | None,
) -> tuple[jax.Array, jax.Array]:
    """meta = (qsl, num_computed, has_init, read, write, first chunk, chunk count) as
    `gdn/chunk.py` builds them, and the boundary slots when block_size is given; tiles = (W, U,
    KD, QE, AQK) from kernel 1; state [S, HV, V, K] fp32. Returns (o [T, HV, V], the pool with
    final and boundary states)."""
    pool = jax.new_ref(state)
    call = _chain_call(tiles, state.shape, num_tokens, v_dtype, block_size, meta[0].shape[0] - 1)
    o = call(*meta, totals, *tiles, pool)
    return o, pool[...]


def _chain_call(tiles, pool_shape, num_tokens: int, v_dtype, block_size, num_rows: int):
    """The `plgpu.kernel` of a call's shapes."""
    num_slots, heads, v_dim, k_dim = pool_shape
    dtype = tiles[0].dtype
    wgmma_layout = plgpu.Layout.WGMMA

    def kernel(*refs):
        meta, bounds, refs = split_operands(refs, 7, block_size)
        qsl, computed, has_init, reads, writes, first_chunk, counts = meta
        totals, w_ref, u_ref, kd_ref, qe_ref, aqk_ref, pool_ref, o_ref = refs[:8]
        buffers, bars = refs[8:]
        w_s, u_s, kd_s, qe_s, aqk_s, st_s, vn_s, o_s, f_s = buffers
        *loaded, consumed, one = bars
        h, vt, r = lax.axis_index("heads"), lax.axis_index("vtiles"), lax.axis_index("rows")
        wg = lax.axis_index("wg")
        rr = jnp.minimum(r, num_rows - 1)
        q0, q1, nc = qsl[rr], qsl[rr + 1], computed[rr]
        base = q0 - nc % Q  # the flat token of the row's first chunk's absolute start
        num_chunks = jnp.where(r < num_rows, counts[rr], 0)
        vcols = pl.ds(vt * BV, BV)

        def fetch(j, slot):
            """Chunk j's tiles into stage `slot` (a tile is indexed by its chunk: aligned)."""
            c = first_chunk[rr] + j
            sources = (w_ref.at[c, h], u_ref.at[c, h, :, vcols], kd_ref.at[c, h])
            sources += (qe_ref.at[c, h], aqk_ref.at[c, h])
            targets = (w_s, u_s, kd_s, qe_s, aqk_s)
            for src, dst, bar in zip(sources, targets, loaded, strict=True):
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

        @pl.when(wg == 1)
        def _memory():
            fill_stages(num_chunks, STAGES, consumed, fetch, registers=40)

        def save(s, slot):
            """The fp32 state slice to pool slot `slot` (nothing when it is not live)."""
            store_state(s, f_s, pool_ref, (slot, h, vcols), live_slot(slot, num_slots))

        def chunk(j, s):
            slot = lax.rem(j, STAGES)
            tok0 = base + j * Q
            t0 = jnp.maximum(tok0, q0)
            n = jnp.minimum(tok0 + Q, q1) - t0
            for bar in loaded:
                plgpu.barrier_wait(bar.at[slot])

            def products(acc_w, acc_q):
                plgpu.wgmma(acc_w, w_s.at[slot], st_s.transpose((1, 0)))
                plgpu.wgmma(acc_q, qe_s.at[slot], st_s.transpose((1, 0)))
                return acc_w[...], acc_q[...]

            ws, qs = pl.run_scoped(
                products, plgpu.ACC((Q, BV), jnp.float32), plgpu.ACC((Q, BV), jnp.float32)
            )
            u = plgpu.load(u_s.at[slot], layout=wgmma_layout).astype(jnp.float32)
            vn_s[...] = (u - ws).astype(dtype)  # v_new; rows past n are zero (tiles are)
            plgpu.commit_smem()

            def attend(acc):
                plgpu.wgmma(acc, aqk_s.at[slot], vn_s)

            o = pl.run_state(attend)(plgpu.ACC.init(qs))
            ys = lax.rem(j, 2)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            o_s.at[ys][...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            store_rows(o_s.at[ys], o_ref, (h, vcols), t0, n)

            def update(acc):
                plgpu.wgmma(acc, vn_s.transpose((1, 0)), kd_s.at[slot])

            s = pl.run_state(update)(plgpu.ACC.init(s * jnp.exp(totals[first_chunk[rr] + j, h])))
            plgpu.barrier_arrive(consumed.at[slot])
            st_s[...] = s.astype(dtype)
            plgpu.commit_smem()
            if block_size is not None:  # prefix caching: the state at a block boundary
                end = nc - nc % Q + (j + 1) * Q
                col = end // block_size - nc // block_size - 1
                bound = bounds[rr, jnp.clip(col, 0, bounds.shape[1] - 1)]
                hit = (end % block_size == 0) & (tok0 + Q <= q1) & (col < bounds.shape[1])
                save(s, jnp.where(hit, bound, 0))
            return s

        @pl.when((wg == 0) & (r < num_rows))
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            read = jnp.where(has_init[rr] != 0, reads[rr], 0)
            source = pool_ref.at[safe_slot(read, num_slots), h, vcols]
            plgpu.copy_gmem_to_smem(source, f_s, one.at[0])
            plgpu.barrier_wait(one.at[0])
            s = load_state(f_s, st_s, live_slot(read, num_slots))
            s = lax.fori_loop(0, num_chunks, chunk, s)
            save(s, writes[rr])
            plgpu.wait_smem_to_gmem(0)

        @pl.when((wg == 0) & (r == num_rows))
        def _padding():
            zero_padding(o_s.at[0], o_ref, (h, vcols), qsl, num_rows, num_tokens)

    def entry(*refs):
        buffers = (
            swizzled_smem((Q, k_dim), dtype, STAGES),  # W
            plgpu.SMEM((STAGES, Q, BV), dtype),  # U, this program's columns
            swizzled_smem((Q, k_dim), dtype, STAGES),  # KD
            swizzled_smem((Q, k_dim), dtype, STAGES),  # QE
            swizzled_smem((Q, Q), dtype, STAGES),  # AQK
            swizzled_smem((BV, k_dim), dtype),  # the state entering the chunk, bf16
            swizzled_smem((Q, BV), dtype),  # v_new
            plgpu.SMEM((2, Q, BV), v_dtype),  # o, two chunks' TMA stores in flight
            plgpu.SMEM((BV, k_dim), jnp.float32),  # a state slice read or written
        )
        # TMA of W, U, KD, QE, AQK; a stage released by the compute warpgroup; the state read.
        bars = [plgpu.Barrier(num_barriers=STAGES) for _ in range(5)]
        bars += [plgpu.Barrier(num_barriers=STAGES), plgpu.Barrier(num_barriers=1)]
        pl.run_scoped(
            lambda *args: kernel(*refs, args[: len(buffers)], args[len(buffers) :]),
            *buffers,
            *bars,
            collective_axes="wg",
        )

    return plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((num_tokens, heads, v_dim), v_dtype),
        grid=(heads, v_dim // BV, num_rows + 1),
        grid_names=("heads", "vtiles", "rows"),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )


def supports(*args: object, **kwargs: object) -> bool:
    """Whether `gdn_chunk_hopper` runs a call of the op with these arguments (`_dispatch` asks):
    an sm_90 GPU and `fits`. Static: shapes, dtypes, the model's config and the device, never
    the batch."""
    a = call_arguments(_OP_SIGNATURE, args, kwargs)
    return fits(a["q"], a["k"], a["v"], a["state"], a["chunk_size"]) and on_hopper()


def fits(q: jax.Array, k: jax.Array, v: jax.Array, state: jax.Array, chunk_size: int) -> bool:
    """q, k and v in one of bf16 / fp16, K in K_DIMS, V a multiple of BV, chunks of Q tokens
    and an fp32 state pool."""
    return (
        chunk_size == Q
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and k.dtype == v.dtype == q.dtype
        and q.shape[2] in K_DIMS
        and v.shape[2] % BV == 0
        and state.dtype == jnp.float32
    )


@functools.partial(jax.jit, static_argnames=("scale", "use_qk_l2norm", "chunk_size"))
def gdn_chunk_hopper(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    state: jax.Array,
    rows: Rows,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """`gdn_chunk_reference` (same arguments and results) with kernel 1 in Triton and the chain
    in Mosaic GPU, for the calls it `fits`."""
    check_chunk_args(q, k, v, g, beta, state, rows, chunk_size)
    if not fits(q, k, v, state, chunk_size):
        raise ValueError(
            f"the Hopper GDN chain takes bf16 / fp16 q, k, v, chunk_size {Q}, K in {K_DIMS}, V a "
            f"multiple of {BV} and an fp32 pool; got {q.dtype} chunk_size={chunk_size}, "
            f"K {q.shape[2]}, V {v.shape[2]}, pool {state.dtype}"
        )
    num_tokens = q.shape[0]
    qsl, nc, has_init, read, write, bounds = rows.int32_operands()
    cstart, clen, count, c0 = chunk_tiles(qsl, nc, num_tokens, chunk_size)
    spec = intra_spec(q, v, scale, use_qk_l2norm, chunk_size, ChunkTuning(), False)
    tiles = intra_tiles(
        q, k, v, g, beta, cstart, clen, spec, num_warps=4, split=False, interpret=False
    )
    cached = boundary_operands(bounds, rows.block_size)
    meta = own_buffers(qsl, nc, has_init, read, write, c0, count, *cached)
    totals = chunk_totals(g, cstart, clen)
    return gdn_chain_mgpu(meta, totals, tiles, state, num_tokens, v.dtype, rows.block_size)


_OP_SIGNATURE = inspect.signature(gdn_chunk_hopper)  # the op's: `supports` reads its arguments
