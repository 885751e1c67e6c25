"""The sequential SSD scan for Hopper, in Mosaic GPU: wgmma and TMA, the state in registers.

The design of `ssd/sequential.py` (one program per (head, row) walks the row's chunks in order),
written for sm_90a: on the H100 the Triton lowering of that design runs about as fast as
mamba_ssm, this kernel well ahead of both (benchmarks/results/README.md). Each program is two
warpgroups:

    warpgroup 1 (memory)   TMA: the tiles of up to STAGES chunks ahead of the one computed
                           x [Q, P], B, C [Q, N] (through untiled buffers, see below), z [Q, P],
                           dt', cum [Q] twice (rows and columns); a stage is refilled once the
                           compute warpgroup releases it
    warpgroup 0 (compute)  per chunk of n <= Q tokens, s the fp32 [P, N] state:
                           1. scores = (C B^T) * exp(cum_i - cum_j) * dt'_j, j <= i, j < n
                           2. y = exp(cum_i) (C s^T) + scores x         (s^T: a bf16 copy)
                           3. y = (y + D x) * silu(z)  ->  TMA store of the chunk's n tokens
                           4. s = exp(cum_n) s + (x * dt' * exp(cum_n - cum))^T B

    1, 2 and 4 are wgmmas of M = Q = 64 in bf16 with fp32 accumulation; 4 accumulates into s.

Chunks end at absolute multiples of Q, as in the Triton kernel, so a request's result does not
depend on how its prompt was chunked; but the two kernels group sums differently, so which one
runs is fixed per model (`supports`: the shapes, the dtypes, the model's config and the device),
never per batch. dt' (softplus, clamp) and cum, the in-chunk inclusive cumsum of dt' A, come from
XLA (`decay_inputs`): a row of Q lanes per chunk of the call, computed from the chunk's tokens
alone. Extra program row R zeroes the padding tokens. Slots as in `Rows`: a slot that is not
live reads zeros (selected with `where`, so a NaN in slot 0 cannot leak) and writes nothing.

What Mosaic GPU asked for (each found on the H100 or by its layout inference, which runs on a
CPU when the kernel is lowered for CUDA there):
- TMA into the tiled, swizzled buffers wgmma reads needs a token offset it can prove a multiple
  of 8; rows start anywhere, so x, B and C land in untiled buffers and are copied over;
- a 1-D TMA needs a 16-byte aligned start: dt' and cum come as chunk rows, not per token;
- an SMEM buffer is loaded in one register layout: dt' and cum come twice (rows and columns);
- no implicit scalar broadcasts in warpgroup code.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels._common import dt_activation, live_slot, safe_slot
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
from pallas_kernels.rows import Rows
from pallas_kernels.ssd.chunk_kernels import chunk_table
from pallas_kernels.ssd.reference import check_scan_args

Q = 64  # tokens a chunk: the M of every wgmma
STAGES = 2  # chunks of tiles in flight
HEAD_DIMS, STATE_SIZES = (64,), (64, 128)  # what the register budget and wgmma tiles take


def supports(*args: object, **kwargs: object) -> bool:
    """Whether `ssd_chunk_scan_hopper` runs a call of the op with these arguments (`_dispatch`
    asks): an sm_90 GPU, `fits`, and D given (without it the kernel would take a constant, see
    `boundary_operands`). Static: shapes, dtypes, the model's config and the device, never the
    batch."""
    a = call_arguments(_OP_SIGNATURE, args, kwargs)
    fit = fits(a["x"], a["B"], a["C"], a["ssm_state"], a["chunk_size"], a["algorithm"])
    return fit and a["D"] is not None and on_hopper()


def fits(
    x: jax.Array, B: jax.Array, C: jax.Array, ssm_state: jax.Array, chunk_size: int, algorithm: str
) -> bool:
    """The sequential algorithm, x, B and C in bf16 or fp16, P in HEAD_DIMS, N in STATE_SIZES,
    an fp32 state pool, and chunks (hence state blocks) a multiple of Q."""
    return (
        algorithm == "sequential"
        and chunk_size % Q == 0
        and x.dtype in (jnp.bfloat16, jnp.float16)
        and B.dtype == C.dtype == x.dtype
        and x.shape[2] in HEAD_DIMS
        and B.shape[2] in STATE_SIZES
        and ssm_state.dtype == jnp.float32
    )


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit", "chunk_size", "algorithm"))
def ssd_chunk_scan_hopper(
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
    """This kernel for `ssd_chunk_scan_reference` (same arguments and results) where `supports`
    says it applies (it lowers anywhere, and runs on sm_90 only)."""
    check_scan_args(x, dt, A, B, C, ssm_state, rows, D, z, dt_bias, chunk_size, algorithm)
    if not fits(x, B, C, ssm_state, chunk_size, algorithm):
        raise ValueError(
            f"the Hopper SSD scan takes the sequential algorithm, bf16 / fp16 x, B, C, "
            f"P in {HEAD_DIMS}, N in {STATE_SIZES}, an fp32 pool and chunk_size a multiple of "
            f"{Q}; got {algorithm}, x {x.dtype}{x.shape}, B {B.dtype}{B.shape}, pool "
            f"{ssm_state.dtype}, chunk_size={chunk_size}"
        )
    if D is None:
        raise ValueError("the Hopper SSD scan takes D (the reference's kernel runs calls without)")
    heads = x.shape[1]
    dt_bias = jnp.zeros((heads,), jnp.float32) if dt_bias is None else dt_bias
    qsl, computed, has_init, read, write, bounds = rows.int32_operands()
    dt_lanes, cum_lanes, first_chunk = decay_inputs(
        (qsl, computed), dt, A, dt_bias, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit)
    )
    d_lanes = jnp.broadcast_to(D.astype(jnp.float32)[:, None], (heads, Q))
    pool = jax.new_ref(ssm_state)  # the kernel writes the final and boundary states in place
    call = _scan_call(x, B, z, ssm_state.shape[0], rows.block_size, rows.num_rows)
    cached = boundary_operands(bounds, rows.block_size)
    meta = own_buffers(qsl, computed, has_init, read, write, first_chunk, *cached)
    y = call(*meta, x, dt_lanes, cum_lanes, B, C, x if z is None else z, d_lanes, pool)
    return y, pool[...]


def decay_inputs(meta, dt, A, dt_bias, *, dt_softplus, dt_limit):
    """(dt' [H, C * Q], cum [H, C * Q], first chunk [R]): per chunk of the call (`chunk_table`,
    chunks ending at absolute multiples of Q inside each row), a row of Q lanes holding its
    tokens' activated dt and the inclusive cumsum of dt' A from its first token, lane i the
    chunk's i-th token (zeros past its end); and the index of each row's first chunk. A chunk's
    row depends only on its own tokens, whatever else the call holds, and the kernel's TMA reads
    it at an aligned offset. The rows are gathered from the tokens (a scatter of [T, H] values
    was the slower on the H100, benchmarks/results/README.md)."""
    num_tokens = dt.shape[0]
    chunk_t0, chunk_n, first, _ = chunk_table(meta[0], meta[1], num_tokens, Q)
    lanes = jnp.arange(Q, dtype=jnp.int32)
    token = jnp.minimum(chunk_t0[:, None] + lanes, num_tokens - 1).reshape(-1)
    valid = (lanes < chunk_n[:, None]).reshape(-1)
    dt = dt_activation(dt.astype(jnp.float32) + dt_bias[None, :], dt_softplus, dt_limit).T
    dt_rows = jnp.where(valid, dt[:, token], 0.0)  # [H, C * Q]
    cum_rows = jnp.cumsum((dt_rows * A[:, None]).reshape(dt.shape[0], -1, Q), axis=2)
    return dt_rows, cum_rows.reshape(dt_rows.shape), first


def _scan_call(x, B, z, num_slots: int, block_size: int | None, num_rows: int):
    """The `plgpu.kernel` of a call's shapes."""
    num_tokens, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    per_group = heads // groups
    dtype, has_z = x.dtype, z is not None
    wgmma_layout = plgpu.Layout.WGMMA
    row, col = wgmma_layout.reduce(1), wgmma_layout.reduce(0)

    def kernel(*refs):
        meta, bounds, refs = split_operands(refs, 6, block_size)
        qsl, computed, has_init, reads, writes, first_chunk = meta
        x_ref, dt_ref, cum_ref, b_ref, c_ref, z_ref, d_ref, pool_ref, y_ref = refs[:9]
        buffers, bars = refs[9:]
        x_s, b_s, c_s, z_s, dt_s, cum_s, dtc_s, cumc_s, d_s, st_s, xw_s, y_s, f_s = buffers[:13]
        xu_s, bu_s, cu_s = buffers[13:]
        *loaded, staging, restaged, consumed, one = bars
        h, r = lax.axis_index("heads"), lax.axis_index("rows")
        g = lax.div(h, jnp.array(per_group, h.dtype))
        wg = lax.axis_index("wg")
        start = qsl[jnp.minimum(r, num_rows - 1)]
        length = qsl[jnp.minimum(r + 1, num_rows)] - start
        pos0 = computed[jnp.minimum(r, num_rows - 1)]
        first = jnp.minimum(length, Q - pos0 % Q)
        num_chunks = jnp.where((r < num_rows) & (length > 0), pl.cdiv(length - first, Q) + 1, 0)

        def placed(k):
            """(first token, tokens) of the row's chunk k."""
            off = jnp.where(k == 0, 0, first + (k - 1) * Q)
            return start + off, jnp.where(k == 0, first, jnp.minimum(Q, length - off))

        def fetch(k, slot):
            """Chunk k's tiles into stage `slot`. TMA puts x, B and C in untiled buffers first:
            Mosaic GPU's TMA into the tiled, swizzled buffers wgmma reads needs a token offset
            it can prove a multiple of 8, and rows start anywhere. They are copied over through
            registers; z, dt' and cum stay untiled."""
            tok = pl.ds(placed(k)[0], Q)
            lanes = pl.ds((first_chunk[jnp.minimum(r, num_rows - 1)] + k) * Q, Q)
            sources = [z_ref.at[tok, h] if has_z else None, dt_ref.at[h, lanes]]
            sources += [cum_ref.at[h, lanes], dt_ref.at[h, lanes], cum_ref.at[h, lanes]]
            for src, dst, bar in zip(
                sources, (z_s, dt_s, cum_s, dtc_s, cumc_s), loaded, strict=True
            ):
                if src is not None:
                    plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])
            staged = ((x_ref.at[tok, h], xu_s, x_s), (b_ref.at[tok, g], bu_s, b_s))
            staged += ((c_ref.at[tok, g], cu_s, c_s),)
            for n, (src, untiled, _) in enumerate(staged):
                plgpu.copy_gmem_to_smem(src, untiled, staging.at[n])
            for n, (_, untiled, tiled) in enumerate(staged):
                plgpu.barrier_wait(staging.at[n])
                tiled.at[slot][...] = plgpu.load(untiled, layout=wgmma_layout)
            plgpu.commit_smem()
            plgpu.barrier_arrive(restaged.at[slot])

        @pl.when(wg == 1)
        def _memory():
            fill_stages(num_chunks, STAGES, consumed, fetch, registers=104)

        def save(s, slot):
            """The fp32 state to pool slot `slot` (nothing when it is not live)."""
            store_state(s, f_s, pool_ref, (slot, h), live_slot(slot, num_slots))

        def chunk(k, s):
            slot = lax.rem(k, STAGES)
            t0, n = placed(k)
            for kind, bar in enumerate(loaded):
                if has_z or kind != 0:
                    plgpu.barrier_wait(bar.at[slot])
            plgpu.barrier_wait(restaged.at[slot])
            lane_r = plgpu.broadcasted_iota(jnp.int32, (Q,), 0, layout=row)
            lane_c = plgpu.broadcasted_iota(jnp.int32, (Q,), 0, layout=col)
            cum_r = plgpu.load(cum_s.at[slot], layout=row)
            cum_c = plgpu.load(cumc_s.at[slot], layout=col)
            dt_r = jnp.where(lane_r < n, plgpu.load(dt_s.at[slot], layout=row), 0.0)
            dt_c = jnp.where(lane_c < n, plgpu.load(dtc_s.at[slot], layout=col), 0.0)
            total = cum_s.at[slot][n - 1]

            def products(acc_cb, acc_off):
                plgpu.wgmma(acc_cb, c_s.at[slot], b_s.at[slot].transpose((1, 0)))
                plgpu.wgmma(acc_off, c_s.at[slot], st_s.transpose((1, 0)))
                return acc_cb[...], acc_off[...]

            cb, off = pl.run_scoped(
                products, plgpu.ACC((Q, Q), jnp.float32), plgpu.ACC((Q, head_dim), jnp.float32)
            )
            i = plgpu.broadcasted_iota(jnp.int32, (Q, Q), 0, layout=wgmma_layout)
            j = plgpu.broadcasted_iota(jnp.int32, (Q, Q), 1, layout=wgmma_layout)
            seg = lax.broadcast_in_dim(cum_r, (Q, Q), [0]) - lax.broadcast_in_dim(
                cum_c, (Q, Q), [1]
            )
            scores = cb * jnp.exp(jnp.where(j <= i, seg, -jnp.inf))
            scores = scores * lax.broadcast_in_dim(dt_c, (Q, Q), [1])
            off = off * lax.broadcast_in_dim(jnp.exp(cum_r), (Q, head_dim), [0])

            def diagonal(acc):
                plgpu.wgmma(acc, scores.astype(dtype), x_s.at[slot])

            y = pl.run_state(diagonal)(plgpu.ACC.init(off))
            xv = plgpu.load(x_s.at[slot], layout=wgmma_layout).astype(jnp.float32)
            y = y + lax.broadcast_in_dim(plgpu.load(d_s, layout=row), (Q, head_dim), [0]) * xv
            if has_z:
                zv = plgpu.load(z_s.at[slot], layout=wgmma_layout).astype(jnp.float32)
                y = y * zv * jax.nn.sigmoid(zv)
            ys = lax.rem(k, 2)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # y_s[ys]'s last stores are read
            y_s.at[ys][...] = y.astype(dtype)
            weight = dt_r * jnp.exp(total - cum_r)
            xw_s[...] = (xv * lax.broadcast_in_dim(weight, (Q, head_dim), [0])).astype(dtype)
            plgpu.commit_smem()
            store_rows(y_s.at[ys], y_ref, (h,), t0, n)

            def update(acc):
                plgpu.wgmma(acc, xw_s.transpose((1, 0)), b_s.at[slot])

            s = pl.run_state(update)(plgpu.ACC.init(s * jnp.exp(total)))
            plgpu.barrier_arrive(consumed.at[slot])
            st_s[...] = s.astype(dtype)
            plgpu.commit_smem()
            if block_size is not None:  # prefix caching: the state at a block boundary
                end = pos0 + (t0 - start) + n
                col_j = end // block_size - pos0 // block_size - 1
                bound = bounds[r, jnp.clip(col_j, 0, bounds.shape[1] - 1)]
                hit = (end % block_size == 0) & (col_j < bounds.shape[1])
                save(s, jnp.where(hit, bound, 0))
            return s

        @pl.when((wg == 0) & (r < num_rows))
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            plgpu.copy_gmem_to_smem(d_ref.at[h], d_s, one.at[0])
            rr = jnp.minimum(r, num_rows - 1)
            read = jnp.where(has_init[rr] != 0, reads[rr], 0)
            plgpu.copy_gmem_to_smem(pool_ref.at[safe_slot(read, num_slots), h], f_s, one.at[1])
            plgpu.barrier_wait(one.at[0])
            plgpu.barrier_wait(one.at[1])
            s = load_state(f_s, st_s, live_slot(read, num_slots))
            s = lax.fori_loop(0, num_chunks, chunk, s)
            save(s, writes[rr])
            plgpu.wait_smem_to_gmem(0)

        @pl.when((wg == 0) & (r == num_rows))
        def _padding():
            zero_padding(y_s.at[0], y_ref, (h,), qsl, num_rows, num_tokens)

    def entry(*refs):
        buffers = (
            swizzled_smem((Q, head_dim), dtype, STAGES),  # x
            swizzled_smem((Q, state), dtype, STAGES),  # B
            swizzled_smem((Q, state), dtype, STAGES),  # C
            plgpu.SMEM((STAGES, Q, head_dim), dtype),  # z
            *(plgpu.SMEM((STAGES, Q), jnp.float32) for _ in range(4)),  # dt', cum; again
            plgpu.SMEM((Q,), jnp.float32),  # D on every lane
            swizzled_smem((head_dim, state), dtype),  # the state entering the chunk, bf16
            swizzled_smem((Q, head_dim), dtype),  # x weighted for the state update
            plgpu.SMEM((2, Q, head_dim), dtype),  # y, two chunks' TMA stores in flight
            plgpu.SMEM((head_dim, state), jnp.float32),  # a state read or written
            plgpu.SMEM((Q, head_dim), dtype),  # x, B, C as TMA leaves them (`fetch`)
            plgpu.SMEM((Q, state), dtype),
            plgpu.SMEM((Q, state), dtype),
        )
        # TMA of z, dt', cum, dt' and cum as columns; x, B, C staged, and their tiled copies
        # ready; a stage released by the compute warpgroup; D and the initial state read.
        bars = [plgpu.Barrier(num_barriers=STAGES) for _ in range(5)]
        bars += [plgpu.Barrier(num_barriers=3), plgpu.Barrier(num_barriers=STAGES)]
        bars += [plgpu.Barrier(num_barriers=STAGES), plgpu.Barrier(num_barriers=2)]
        pl.run_scoped(
            lambda *args: kernel(*refs, args[: len(buffers)], args[len(buffers) :]),
            *buffers,
            *bars,
            collective_axes="wg",
        )

    return plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct(x.shape, dtype),
        grid=(heads, num_rows + 1),
        grid_names=("heads", "rows"),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )


_OP_SIGNATURE = inspect.signature(ssd_chunk_scan_hopper)  # the op's: `supports` reads its arguments
