"""Can a Mosaic GPU (wgmma + TMA) sequential SSD scan reach issue 29's prefill goal? A spike.

The models' SSD path is the sequential scan (`pallas_kernels/ssd/sequential.py`): one program per
(row, head) walks its row's chunks in order with the state on chip. In Triton it takes 854 us at
1x8192 on the H100 against mamba_ssm's 629 (RESULTS.md, 2026-11-27). This probe writes the same
design for Hopper in Mosaic GPU, without the serving contract (rows of equal length, a multiple of
the chunk; no slots, no boundary states; the state starts at zero), to learn what the design is
worth before porting the contract: one warpgroup computes, one feeds it through TMA, and per
chunk of Q = 64 tokens four wgmmas do the chunk's math, the [P, N] state kept in registers as
the accumulator of the last one:

    scores = (C B^T) * exp(cum_i - cum_j) * dt_j     for j <= i   (wgmma 1, then registers)
    y      = exp(cum_i) * (C s^T) + scores x          (wgmmas 2 and 3, s^T from a bf16 copy)
    y      = (y + D x) * silu(z)
    s      = exp(cum_Q) s + (x * dt * exp(cum_Q - cum))^T B                       (wgmma 4)

cum (the in-chunk inclusive cumsum of dt A) and the activated dt come from XLA, [H, T] each.

    PYTHONPATH=. python benchmarks/probe_ssd_mgpu.py --check        # CPU: interpret mode
    PYTHONPATH=. python benchmarks/probe_ssd_mgpu.py --shapes 1x8192,8x2048,1x32768   # GPU
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

Q = 64  # tokens a chunk: the M of every wgmma
HEADS, HEAD_DIM, GROUPS, STATE = 128, 64, 8, 128  # the Mamba2 layer of issue 29's goal table


def _smem(shape, dtype, stages=None):
    """A swizzled, tiled SMEM buffer (what TMA writes and wgmma reads); `stages` copies."""
    swizzle = 128
    elems = swizzle // jnp.dtype(dtype).itemsize
    transforms = (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))
    full = shape if stages is None else (stages, *shape)
    return plgpu.SMEM(full, dtype, transforms=transforms)


def ssd_scan_mgpu(x, dt, A, B, C, D, z, dt_bias, *, rows: int, stages: int = 2):
    """y [T, H, P] and the final states [rows, H, P, N] fp32 of `rows` equal rows of T / rows
    tokens each (a multiple of Q), each starting from a zero state. P must equal Q (the chunk's
    total decay reaches the state's rows as a row vector)."""
    num_tokens, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    length = num_tokens // rows
    if length % Q or num_tokens % rows or head_dim != Q:
        raise ValueError(
            f"rows of {num_tokens} / {rows} tokens, P {head_dim}: need multiples of {Q}"
        )
    num_chunks = length // Q
    per_group = heads // groups
    dt = jax.nn.softplus(dt.astype(jnp.float32) + dt_bias[None, :])  # [T, H]
    dt_t = dt.T  # [H, T]
    cum = jnp.cumsum((dt * A[None, :]).T.reshape(heads, -1, Q), axis=-1)
    last = jnp.broadcast_to(cum[..., -1:], cum.shape).reshape(heads, -1)
    cum = cum.reshape(heads, -1)
    d_rows = jnp.broadcast_to(D.astype(jnp.float32)[:, None], (heads, Q))
    dtype = x.dtype
    has_z = z is not None
    z = x if z is None else z  # a stand-in operand, never loaded
    wgmma_layout, row, col = (
        plgpu.Layout.WGMMA,
        plgpu.Layout.WGMMA.reduce(1),
        plgpu.Layout.WGMMA.reduce(0),
    )

    def kernel(
        x_ref, dt_ref, cum_ref, last_ref, b_ref, c_ref, z_ref, d_ref, y_ref, s_ref, buffers, bars
    ):
        x_s, b_s, c_s, z_s, dt_s, cum_s, last_s, dtc_s, cumc_s, d_s, st_s, xw_s, y_s, out_s = (
            buffers
        )
        *loaded, consumed, d_bar = bars
        h, r = lax.axis_index("heads"), lax.axis_index("rows")
        g = lax.div(h, jnp.array(per_group, h.dtype))
        wg = lax.axis_index("wg")
        t_row = r * length

        def fetch(k, slot):
            tok = pl.ds(t_row + k * Q, Q)
            sources = (
                x_ref.at[tok, h],
                b_ref.at[tok, g],
                c_ref.at[tok, g],
                z_ref.at[tok, h] if has_z else None,
                dt_ref.at[h, tok],
                cum_ref.at[h, tok],
                last_ref.at[h, tok],
                dt_ref.at[h, tok],
                cum_ref.at[h, tok],
            )
            # dt and cum twice: a buffer is loaded in one layout (rows or columns) only.
            targets = (x_s, b_s, c_s, z_s, dt_s, cum_s, last_s, dtc_s, cumc_s)
            for src, dst, bar in zip(sources, targets, loaded, strict=True):
                if src is not None:
                    plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

        @pl.when(wg == 1)
        def _memory():
            plgpu.set_max_registers(40, action="decrease")
            for k in range(min(stages, num_chunks)):
                fetch(k, k)

            @pl.loop(stages, num_chunks)
            def _(k):
                slot = lax.rem(k, stages)
                plgpu.barrier_wait(consumed.at[slot])
                fetch(k, slot)

        @pl.when(wg == 0)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            plgpu.copy_gmem_to_smem(d_ref.at[h], d_s, d_bar.at[0])
            plgpu.barrier_wait(d_bar.at[0])
            d_skip = plgpu.load(d_s, layout=row)
            s0 = plgpu.layout_cast(jnp.zeros((head_dim, state), jnp.float32), wgmma_layout)
            st_s[...] = s0.astype(dtype)
            plgpu.commit_smem()
            i = plgpu.broadcasted_iota(jnp.int32, (Q, Q), 0, layout=wgmma_layout)
            j = plgpu.broadcasted_iota(jnp.int32, (Q, Q), 1, layout=wgmma_layout)

            def chunk(k, s):
                slot = lax.rem(k, stages)
                for kind, bar in enumerate(loaded):
                    if has_z or kind != 3:
                        plgpu.barrier_wait(bar.at[slot])
                cum_r = plgpu.load(cum_s.at[slot], layout=row)
                cum_c = plgpu.load(cumc_s.at[slot], layout=col)
                last_r = plgpu.load(last_s.at[slot], layout=row)
                dt_c = plgpu.load(dtc_s.at[slot], layout=col)
                dt_r = plgpu.load(dt_s.at[slot], layout=row)

                def products(acc_cb, acc_off):
                    plgpu.wgmma(acc_cb, c_s.at[slot], b_s.at[slot].transpose((1, 0)))
                    plgpu.wgmma(acc_off, c_s.at[slot], st_s.transpose((1, 0)))
                    return acc_cb[...], acc_off[...]

                cb, off = pl.run_scoped(
                    products, plgpu.ACC((Q, Q), jnp.float32), plgpu.ACC((Q, head_dim), jnp.float32)
                )
                seg = lax.broadcast_in_dim(cum_r, (Q, Q), [0]) - lax.broadcast_in_dim(
                    cum_c, (Q, Q), [1]
                )
                decay = jnp.exp(jnp.where(j <= i, seg, -jnp.inf))
                scores = cb * decay * lax.broadcast_in_dim(dt_c, (Q, Q), [1])
                off = off * lax.broadcast_in_dim(jnp.exp(cum_r), (Q, head_dim), [0])

                def diagonal(acc):
                    plgpu.wgmma(acc, scores.astype(dtype), x_s.at[slot])

                y = pl.run_state(diagonal)(plgpu.ACC.init(off))
                xv = plgpu.load(x_s.at[slot], layout=wgmma_layout).astype(jnp.float32)
                y = y + lax.broadcast_in_dim(d_skip, (Q, head_dim), [0]) * xv
                if has_z:
                    zv = plgpu.load(z_s.at[slot], layout=wgmma_layout).astype(jnp.float32)
                    y = y * zv * jax.nn.sigmoid(zv)
                ys = lax.rem(k, 2)
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # y_s[ys]'s last store is read
                y_s.at[ys][...] = y.astype(dtype)
                weight = dt_r * jnp.exp(last_r - cum_r)
                xw_s[...] = (xv * lax.broadcast_in_dim(weight, (Q, head_dim), [0])).astype(dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(y_s.at[ys], y_ref.at[pl.ds(t_row + k * Q, Q), h])

                def update(acc):
                    plgpu.wgmma(acc, xw_s.transpose((1, 0)), b_s.at[slot])

                decay_s = lax.broadcast_in_dim(jnp.exp(last_r), (head_dim, state), [0])
                s = pl.run_state(update)(plgpu.ACC.init(s * decay_s))
                plgpu.barrier_arrive(consumed.at[slot])
                st_s[...] = s.astype(dtype)
                plgpu.commit_smem()
                return s

            s = lax.fori_loop(0, num_chunks, chunk, s0)
            out_s[...] = s
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_s, s_ref.at[r, h])
            plgpu.wait_smem_to_gmem(0)

    def entry(*refs):
        buffers = (
            _smem((Q, head_dim), dtype, stages),  # x
            _smem((Q, state), dtype, stages),  # B
            _smem((Q, state), dtype, stages),  # C
            _smem((Q, head_dim), dtype, stages),  # z
            plgpu.SMEM((stages, Q), jnp.float32),  # dt
            plgpu.SMEM((stages, Q), jnp.float32),  # cum
            plgpu.SMEM((stages, Q), jnp.float32),  # the chunk's total, on every token
            plgpu.SMEM((stages, Q), jnp.float32),  # dt, loaded as columns
            plgpu.SMEM((stages, Q), jnp.float32),  # cum, loaded as columns
            plgpu.SMEM((Q,), jnp.float32),  # D, on every token
            _smem((head_dim, state), dtype),  # the state entering the chunk, bf16
            _smem((Q, head_dim), dtype),  # x weighted for the state update
            _smem((Q, head_dim), dtype, 2),  # y, double-buffered for its TMA store
            plgpu.SMEM((head_dim, state), jnp.float32),  # the final state
        )
        bars = (
            *(plgpu.Barrier(num_barriers=stages) for _ in range(9)),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=1),
        )
        pl.run_scoped(
            lambda *args: kernel(*refs, args[: len(buffers)], args[len(buffers) :]),
            *buffers,
            *bars,
            collective_axes="wg",
        )

    call = plgpu.kernel(
        entry,
        out_type=(
            jax.ShapeDtypeStruct(x.shape, dtype),
            jax.ShapeDtypeStruct((rows, heads, head_dim, state), jnp.float32),
        ),
        grid=(heads, rows),
        grid_names=("heads", "rows"),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )
    return call(x, dt_t, cum, last, B, C, z, d_rows)


def _f32(a):
    return a.astype(jnp.float32)


def _split(rows, a):
    return a.reshape(rows, -1, *a.shape[1:])


def scan_reference(x, dt, A, B, C, D, z, dt_bias, *, rows):
    """Token by token in fp32: the SSD recurrence of pallas_kernels/ssd/reference.py's glossary."""
    num_tokens, heads, head_dim = x.shape
    per_group = heads // B.shape[1]
    dt = jax.nn.softplus(_f32(dt) + dt_bias[None, :])
    Bh, Ch = (jnp.repeat(_f32(m), per_group, axis=1) for m in (B, C))

    def row(xr, dtr, br, cr, zr):
        def step(s, t):
            xt, dtt, bt, ct = t
            s = (
                jnp.exp(dtt * A)[:, None, None] * s
                + (dtt[:, None] * xt)[:, :, None] * bt[:, None, :]
            )
            return s, jnp.einsum("hpn,hn->hp", s, ct)

        s0 = jnp.zeros((heads, head_dim, Bh.shape[-1]), jnp.float32)
        s, y = lax.scan(step, s0, (xr, dtr, br, cr))
        y = y + D[None, :, None] * xr
        y = y if zr is None else y * jax.nn.silu(zr)
        return y, s

    zs = None if z is None else _split(rows, _f32(z))
    y, s = jax.vmap(row)(
        _split(rows, _f32(x)), _split(rows, dt), _split(rows, Bh), _split(rows, Ch), zs
    )
    return y.reshape(x.shape), s


def make_inputs(rows, length, heads=HEADS, head_dim=HEAD_DIM, groups=GROUPS, state=STATE, seed=0):
    keys = jax.random.split(jax.random.key(seed), 8)
    t = rows * length
    bf = jnp.bfloat16
    return dict(
        x=jax.random.normal(keys[0], (t, heads, head_dim), bf),
        dt=(jax.random.normal(keys[1], (t, heads)) * 0.5 - 2.0).astype(bf),
        A=-jnp.exp(jax.random.uniform(keys[2], (heads,), minval=0.0, maxval=2.5)),
        B=(jax.random.normal(keys[3], (t, groups, state)) * 0.3).astype(bf),
        C=(jax.random.normal(keys[4], (t, groups, state)) * 0.3).astype(bf),
        D=jax.random.normal(keys[5], (heads,)),
        z=jax.random.normal(keys[6], (t, heads, head_dim), bf),
        dt_bias=jax.random.normal(keys[7], (heads,)) * 0.1,
    )


def rel_err(a, b) -> float:
    """RMS error relative to the RMS of b (the measure of benchmarks/RESULTS.md)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b**2)) + 1e-12))


def check(rows, length, heads, groups, with_z=True):
    """Errors of y and the final states against the fp32 token-by-token reference."""
    args = make_inputs(rows, length, heads=heads, groups=groups)
    if not with_z:
        args["z"] = None
    y, s = jax.jit(functools.partial(ssd_scan_mgpu, rows=rows))(**args)
    y_ref, s_ref = jax.jit(functools.partial(scan_reference, rows=rows))(**args)
    return dict(
        rows=rows,
        length=length,
        heads=heads,
        groups=groups,
        z=with_z,
        err_y=rel_err(y, y_ref),
        err_state=rel_err(s, s_ref),
        finite=bool(jnp.isfinite(y.astype(jnp.float32)).all()),
    )


def lower_on_cpu() -> int:
    """Lower the kernel for CUDA without a GPU (Mosaic GPU's layout inference runs here)."""
    args = make_inputs(2, 128, heads=6, groups=3)
    for z in (args["z"], None):
        f = jax.jit(lambda a, z=z: ssd_scan_mgpu(**dict(a, z=z), rows=2))
        f.trace(args).lower(lowering_platforms=("cuda",))
    print("lowered for cuda")
    return 0


def time_shapes(shapes: list[str], anchors: bool) -> None:
    """Per shape: the Mosaic GPU probe, the models' Triton sequential scan and mamba_ssm, each
    timed on the same inputs (benchmarks/prefill/ssd.py's case; no z, as the anchor runs)."""
    from benchmarks.bench_mamba2_kernels import time_loop
    from benchmarks.bench_prefill import import_anchors
    from benchmarks.prefill.ssd import ssd_case

    loaded = import_anchors() if anchors else None
    for shape in shapes:
        batch, seqlen = map(int, shape.split("x"))
        case = ssd_case(batch, seqlen, quick=False)
        triton_step = case.make_step(dict(algorithm="sequential", seq_block_q=32))
        row = dict(shape=shape)
        row["triton_sequential_us"] = time_loop(
            triton_step, jnp.copy(case.state), inner=case.inner, reps=10, inputs=case.inputs
        )
        extras = case_extras(batch, seqlen)

        def mgpu_step(i, pool, sets, extras=extras, batch=batch):
            x, dt, A, bm, cm = sets[i % len(sets)]
            y, _ = ssd_scan_mgpu(x, dt, A, bm, cm, extras["D"], None, extras["dt_bias"], rows=batch)
            return y, pool

        serving = serving_step(batch, seqlen, extras)
        row["serving_us"] = time_loop(
            serving, jnp.copy(case.state), inner=case.inner, reps=10, inputs=case.inputs
        )
        row.update(
            {
                f"serving_{k}": v
                for k, v in case.check(
                    lambda state, serving=serving, case=case: serving(0, state, case.inputs)
                ).items()
            }
        )
        row["mgpu_us"] = time_loop(
            mgpu_step, jnp.copy(case.state), inner=case.inner, reps=10, inputs=case.inputs
        )
        x, dt, A, bm, cm = case.inputs[0]
        args = dict(x=x, dt=dt, A=A, B=bm, C=cm, D=extras["D"], z=None, dt_bias=extras["dt_bias"])
        y_ref, s_ref = jax.jit(functools.partial(scan_reference, rows=batch))(**args)
        y, s = jax.jit(functools.partial(ssd_scan_mgpu, rows=batch))(**args)
        row.update(mgpu_err_y=rel_err(y, y_ref), mgpu_err_state=rel_err(s, s_ref))
        zero_pool = jnp.zeros_like(case.state)
        y_t, pool_t = triton_step(0, zero_pool, case.inputs)
        row.update(triton_err_y=rel_err(y_t, y_ref))
        del y_ref, s_ref, y, s, y_t, pool_t
        if loaded is not None:
            row.update(case.anchor(loaded))
        row["mgpu_vs_triton"] = row["triton_sequential_us"] / row["mgpu_us"]
        if "anchor_us" in row:
            row["mgpu_vs_anchor"] = row["anchor_us"] / row["mgpu_us"]
        print("RESULT", json.dumps(row), flush=True)


def serving_step(batch: int, seqlen: int, extras: dict):
    """A `time_loop` step of the serving kernel on the prefill case's rows and pool."""
    from benchmarks.prefill.case import rows_meta
    from pallas_kernels.ssd.sequential_mgpu import ssd_chunk_scan_hopper

    rows = rows_meta(batch, seqlen)

    def step(i, pool, sets):
        x, dt, A, bm, cm = sets[i % len(sets)]
        kw = dict(D=extras["D"], dt_bias=extras["dt_bias"])
        return ssd_chunk_scan_hopper(x, dt, A, bm, cm, pool, rows, **kw)

    return step


def case_extras(batch: int, seqlen: int) -> dict:
    """D and dt_bias of `ssd_case(batch, seqlen)` (its step closes over them): the same draws."""
    from benchmarks.prefill.ssd import ssd_inputs

    d = ssd_inputs(np.random.default_rng(1), batch, seqlen)
    return dict(D=jnp.asarray(d["D"]), dt_bias=jnp.asarray(d["dt_bias"]))


def contract_case(lengths, computed, heads, groups, num_tokens, block_size, with_z, seed):
    """The serving kernel (`pallas_kernels/ssd/sequential_mgpu.py`) on ragged rows against
    `ssd_chunk_scan_reference`: rows at any flat offset and absolute position, read / write /
    boundary slots, rows without an initial state, slot 0 poisoned with NaN, padding tokens."""
    from pallas_kernels.rows import Rows
    from pallas_kernels.ssd.reference import ssd_chunk_scan_reference
    from pallas_kernels.ssd.sequential_mgpu import ssd_chunk_scan_hopper

    rng = np.random.default_rng(seed)
    args = make_inputs(1, num_tokens, heads=heads, groups=groups, seed=seed)
    num_rows, num_slots = len(lengths), 3 * len(lengths) + 2
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pool = rng.standard_normal((num_slots, heads, HEAD_DIM, STATE)).astype(np.float32)
    pool[0] = np.nan
    boundary = None
    if block_size is not None:
        boundary = np.arange(2 * num_rows, 4 * num_rows, dtype=np.int32).reshape(num_rows, 2)
    rows = Rows(
        query_start_loc=jnp.asarray(qsl),
        num_computed=jnp.asarray(computed, jnp.int32),
        has_initial_state=jnp.asarray([c > 0 for c in computed]),
        read_slots=jnp.arange(1, num_rows + 1, dtype=jnp.int32),
        write_slots=jnp.asarray(
            [num_rows + 1 + r if r % 3 else 0 for r in range(num_rows)], jnp.int32
        ),
        boundary_slots=None if boundary is None else jnp.asarray(boundary),
        block_size=block_size,
    )
    z = args["z"] if with_z else None
    ops = (args["x"], args["dt"], args["A"], args["B"], args["C"])
    y_ref, pool_ref = ssd_chunk_scan_reference(
        *ops, jnp.asarray(pool), rows, D=args["D"], z=z, dt_bias=args["dt_bias"], chunk_size=64
    )
    y, pool_out = ssd_chunk_scan_hopper(
        *ops, jnp.asarray(pool), rows, D=args["D"], z=z, dt_bias=args["dt_bias"], chunk_size=64
    )
    live = slice(1, None)  # slot 0 holds NaN in both
    pad = slice(int(qsl[-1]), None)
    return dict(
        lengths=list(lengths),
        computed=list(computed),
        heads=heads,
        block_size=block_size,
        z=with_z,
        err_y=rel_err(y, y_ref),
        err_pool=rel_err(pool_out[live], pool_ref[live]),
        padding_zero=bool(jnp.all(y[pad] == 0)),
        slot0_nan=bool(jnp.all(jnp.isnan(pool_out[0]))),
        y_finite=bool(jnp.isfinite(y.astype(jnp.float32)).all()),
    )


CONTRACT_CASES = (  # lengths, num_computed, heads, groups, tokens, block_size, z
    ((100, 70, 0, 80), (0, 64, 5, 0), 6, 3, 300, None, True),
    ((129, 64, 65, 1), (0, 128, 63, 7), 10, 5, 290, 128, True),
    ((300, 41), (192, 0), 4, 2, 360, 64, False),
    ((8192,), (0,), 128, 8, 8192, 256, True),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lower", action="store_true", help="lower for CUDA on this machine")
    parser.add_argument("--check", action="store_true", help="odd shapes against the reference")
    parser.add_argument("--contract", action="store_true", help="the serving kernel's contract")
    parser.add_argument("--case", default="", help="one contract case: lengths/computed/tokens")
    parser.add_argument("--shapes", default="", help="e.g. 1x8192,8x2048,1x32768")
    parser.add_argument("--no-anchors", action="store_true")
    args = parser.parse_args(argv)
    if args.lower:
        return lower_on_cpu()
    if args.case:
        lengths, computed, tokens = args.case.split("/")
        parse = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
        case = contract_case(parse(lengths), parse(computed), 6, 3, int(tokens), None, True, 0)
        print("RESULT case", json.dumps(case), flush=True)
    if args.contract:
        for n, case in enumerate(CONTRACT_CASES):
            print("RESULT contract", json.dumps(contract_case(*case, seed=n)), flush=True)
    if args.check:
        for rows, length, heads, groups, z in (
            (1, 128, 4, 2, True),
            (2, 192, 6, 3, True),
            (3, 320, 10, 5, False),
            (1, 8192, 128, 8, True),
        ):
            print("RESULT check", json.dumps(check(rows, length, heads, groups, z)), flush=True)
    if args.shapes:
        time_shapes(args.shapes.split(","), anchors=not args.no_anchors)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
