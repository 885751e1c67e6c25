"""Every Pallas kernel against its plain-jnp reference on odd shapes (architecture.md section 7).

Each grid point is ONE call with many rows of different lengths (compiles dominate on the GPU):
lengths 1, chunk - 1, chunk, chunk + 1, 2 chunk + 2 and several chunks plus a remainder; rows that
continue a request (num_computed > 0) with and without an initial state; one row updated in place;
a padding row and padding tokens; 1 + K-lane decode rows with a dead lane; prefix-caching boundary
slots; NaN in slot 0 (it must stay NaN; every slot the op does not write must stay bit-identical).
Head dims 12, 24, 48, 80, 96 beside 64 and 128, head counts 1, 5, 6, 10, groups 1-3 and conv
channels that are not a multiple of the channel block each appear at least once per kernel, in fp32
and bf16. A check passes when ||out - ref|| / ||ref|| (live outputs, and written states) is within
the dtype's tolerance, padding outputs are exactly 0, and nothing is NaN.

All grid points compile first, in parallel threads (seconds printed apart from the runs); each then
runs under a time limit, so a hang is reported instead of blocking the report.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import secrets
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.checks import Check, on_gpu
from pallas_kernels.attention import decode as pda
from pallas_kernels.attention import reference as attention_ref
from pallas_kernels.conv import prefill as conv
from pallas_kernels.conv import reference as conv_ref
from pallas_kernels.conv import update as conv_update_kernel
from pallas_kernels.gdn import chunk as gdnc
from pallas_kernels.gdn import decode as gdnd
from pallas_kernels.gdn import reference as gdn_ref
from pallas_kernels.gdn import state_update as gdnu
from pallas_kernels.moe import grouped_matmul as gmm
from pallas_kernels.rows import Rows
from pallas_kernels.ssd import chunk_scan as ssd
from pallas_kernels.ssd import decode as m2d
from pallas_kernels.ssd import reference as ssd_ref
from pallas_kernels.ssd import state_update as ssu

F32, BF16 = jnp.float32, jnp.bfloat16
# Relative error allowed per op and input dtype (bf16 inputs: bf16 dot operands and outputs).
TOLERANCE = {
    (F32, "conv"): 1e-5,
    (F32, "update"): 2e-5,
    (F32, "scan"): 1e-4,
    (BF16, "conv"): 1e-2,
    (BF16, "update"): 1e-2,
    (BF16, "scan"): 2e-2,
}
COMPILE_LIMIT_S, RUN_LIMIT_S = (300.0, 60.0) if on_gpu() else (600.0, 300.0)


@dataclasses.dataclass(frozen=True)
class Case:
    """One built grid point: kernel(*args, interpret=) and reference(*args) return (out, pool)."""

    kernel: Callable
    reference: Callable
    args: tuple
    pool_index: int  # position of the state pool in args
    live: np.ndarray  # bool, broadcastable to out: the outputs that are compared (others are 0)
    written: np.ndarray  # slots the op may write; every other slot must stay bit-identical
    tol: float
    layout: str  # rows and tokens, for the report


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[np.random.Generator], Case]


# ----------------------------------------------------------------------------- row layouts


def _pool(rng, num_slots: int, tail: tuple[int, ...], dtype) -> np.ndarray:
    """Random garbage in every slot (pools are not zeroed on allocation), NaN in slot 0."""
    pool = rng.standard_normal((num_slots, *tail)).astype(np.float32)
    pool[0] = np.nan
    return np.asarray(jnp.asarray(pool, dtype))


@dataclasses.dataclass(frozen=True)
class Varlen:
    """Ragged prefill rows of `lengths`, a padding row and padding tokens; slots drawn at random."""

    qsl: np.ndarray
    num_computed: np.ndarray
    has_init: np.ndarray
    read: np.ndarray
    write: np.ndarray
    boundary: np.ndarray  # [R, NB]
    num_slots: int
    num_tokens: int

    @property
    def live(self) -> np.ndarray:
        return np.arange(self.num_tokens) < self.qsl[-1]

    @property
    def written(self) -> np.ndarray:
        return np.concatenate([self.write, self.boundary.ravel()])

    def describe(self) -> str:
        return f"T={self.num_tokens} R={len(self.read)} lengths={np.diff(self.qsl).tolist()}"


def varlen(rng, lengths: list[int], block: int, pad_tokens: int = 5) -> Varlen:
    rows = len(lengths) + 1
    qsl = np.concatenate([[0], np.cumsum(list(lengths) + [0])]).astype(np.int32)
    # Row kinds by index: fresh; continuing (mid-block); continuing from a block boundary;
    # continuing without an initial state; fresh but told to read one (the kernel obeys the flag).
    kind = np.arange(rows) % 5
    nc = np.where(kind == 2, block * rng.integers(1, 4, rows), rng.integers(1, 3 * block, rows))
    nc = np.where(kind == 0, 0, nc).astype(np.int32)
    has_init = (kind == 1) | (kind == 2) | (kind == 4)
    nc[kind == 4] = 0
    nb = max(1, max((int(n) % block + int(m)) // block for n, m in zip(nc, lengths, strict=False)))
    slots = rng.permutation(np.arange(1, 2 * rows + rows * nb + 3)).astype(np.int32)
    read, write = slots[:rows], slots[rows : 2 * rows].copy()
    write[1] = read[1]  # one row updated in place
    boundary = slots[2 * rows : 2 * rows + rows * nb].reshape(rows, nb)
    boundary[rng.random(boundary.shape) < 0.2] = 0  # some boundaries are not cached
    for a in (nc, read, write, boundary):  # the padding row
        a[-1] = 0
    has_init[-1] = False
    return Varlen(
        qsl, nc, has_init, read, write, boundary, len(slots) + 1, int(qsl[-1]) + pad_tokens
    )


def lanes(rng, batch: int, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Decode rows of 1 + K lanes: read slots [B], write slots [B, L], pool size. Row 0 has a dead
    last lane (or is updated in place when L = 1); the last row is padding."""
    slots = rng.permutation(np.arange(1, batch * (width + 1) + 3)).astype(np.int32)
    read, write = slots[:batch], slots[batch : batch * (width + 1)].reshape(batch, width).copy()
    if width == 1:
        write[0, 0] = read[0]
    else:
        write[0, -1] = 0
    read[-1], write[-1] = 0, 0
    return read, write, len(slots) + 1


def _lane_live(write: np.ndarray, tail: int) -> np.ndarray:
    return (write > 0).reshape(write.shape + (1,) * tail)


def _lengths(chunk: int) -> list[int]:
    """1, chunk - 1, chunk, chunk + 1, 2 chunk + 2, 3 chunks + a remainder, and two short rows."""
    return [1, chunk - 1, chunk, 2, chunk + 1, 2 * chunk + 2, 5, 3 * chunk + chunk // 2 + 3]


def _normal(rng, shape, dtype=F32, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32) * scale + shift
    return np.asarray(jnp.asarray(x, dtype))


# ----------------------------------------------------------------------------- grid points


def conv_prefill(channels: int, width: int, dtype, walk_tokens: int = 16) -> Shape:
    """The walk kernel in segments of `walk_tokens`: rows meet segment edges at odd offsets."""
    block = walk_tokens

    def build(rng) -> Case:
        rows = varlen(rng, _lengths(block), block)
        args = (
            _normal(rng, (rows.num_tokens, channels), dtype),
            _normal(rng, (channels, width), dtype, width**-0.5),
            _normal(rng, (channels,), dtype, 0.1),
            _pool(rng, rows.num_slots, (channels, width - 1), dtype),
            Rows(rows.qsl, rows.num_computed, rows.has_init, rows.read, rows.write),
        )
        return Case(
            functools.partial(conv.causal_conv1d_prefill, walk_tokens=walk_tokens),
            conv_ref.causal_conv1d_prefill_reference,
            args,
            3,
            rows.live[:, None],
            rows.write,
            TOLERANCE[dtype, "conv"],
            rows.describe(),
        )

    return Shape(
        f"conv_prefill walk {walk_tokens} D={channels} W={width} {jnp.dtype(dtype).name}", build
    )


def conv_update(channels: int, width: int, num_lanes: int, dtype, batch: int = 6) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        args = (
            _normal(rng, (batch, num_lanes, channels), dtype),
            _normal(rng, (channels, width), dtype, width**-0.5),
            _normal(rng, (channels,), dtype, 0.1),
            _pool(rng, num_slots, (channels, width - 1), dtype),
            read,
            write,
        )
        return Case(
            conv_update_kernel.causal_conv1d_update,
            conv_ref.causal_conv1d_update_reference,
            args,
            3,
            _lane_live(write, 1),
            write.ravel(),
            TOLERANCE[dtype, "conv"],
            f"B={batch} L={num_lanes}",
        )

    return Shape(f"conv_update D={channels} W={width} L={num_lanes} {jnp.dtype(dtype).name}", build)


def ssd_scan(
    algorithm: str,
    heads: int,
    head_dim: int,
    groups: int,
    state: int,
    dtype,
    chunk: int,
    heads_per_program: int | None = None,
) -> Shape:
    """The scan with its default tuning, or with `heads_per_program` heads an output program."""
    kernel = ssd.ssd_chunk_scan
    if heads_per_program is not None:
        kernel = functools.partial(
            kernel, tuning=ssd.ScanTuning(heads_per_program=heads_per_program)
        )

    def build(rng) -> Case:
        rows = varlen(rng, _lengths(chunk), chunk)
        t = rows.num_tokens
        args = (
            _normal(rng, (t, heads, head_dim), dtype),
            _normal(rng, (t, heads), dtype, 1.0, -1.0),
            -np.exp(_normal(rng, (heads,), F32, 0.5)),
            _normal(rng, (t, groups, state), dtype, state**-0.5),
            _normal(rng, (t, groups, state), dtype, state**-0.5),
            _pool(rng, rows.num_slots, (heads, head_dim, state), F32),
            Rows(
                rows.qsl,
                rows.num_computed,
                rows.has_init,
                rows.read,
                rows.write,
                rows.boundary,
                chunk,
            ),
            _normal(rng, (heads,)),
            _normal(rng, (t, heads, head_dim), dtype),
            _normal(rng, (heads,), F32, 0.5),
        )

        def call(fn, *a, **kw):
            d, z, bias = a[7:]
            return fn(*a[:7], D=d, z=z, dt_bias=bias, chunk_size=chunk, algorithm=algorithm, **kw)

        return Case(
            functools.partial(call, kernel),
            functools.partial(call, ssd_ref.ssd_chunk_scan_reference),
            args,
            5,
            rows.live[:, None, None],
            rows.written,
            TOLERANCE[dtype, "scan"],
            rows.describe(),
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} chunk={chunk}"
    dims += "" if heads_per_program is None else f" heads/program={heads_per_program}"
    return Shape(f"ssd_chunk_scan {algorithm} {dims} {jnp.dtype(dtype).name}", build)


def ssd_update(
    heads: int, head_dim: int, groups: int, state: int, num_lanes: int, dtype, batch: int = 6
) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        lead = (batch, num_lanes)
        args = (
            _normal(rng, (*lead, heads, head_dim), dtype),
            _normal(rng, (*lead, heads), dtype, 1.0, -1.0),
            -np.exp(_normal(rng, (heads,), F32, 0.5)),
            _normal(rng, (*lead, groups, state), dtype, state**-0.5),
            _normal(rng, (*lead, groups, state), dtype, state**-0.5),
            _pool(rng, num_slots, (heads, head_dim, state), F32),
            read,
            write,
            _normal(rng, (heads,)),
            _normal(rng, (*lead, heads, head_dim), dtype),
            _normal(rng, (heads,), F32, 0.5),
        )

        def call(fn, *a, **kw):
            return fn(*a[:8], D=a[8], z=a[9], dt_bias=a[10], **kw)

        return Case(
            functools.partial(call, ssu.ssd_state_update),
            functools.partial(call, ssd_ref.ssd_state_update_reference),
            args,
            5,
            _lane_live(write, 2),
            write.ravel(),
            TOLERANCE[dtype, "update"],
            f"B={batch} L={num_lanes}",
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} L={num_lanes}"
    return Shape(f"ssd_state_update {dims} {jnp.dtype(dtype).name}", build)


def _fused_decode_case(
    rng,
    fns: tuple[Callable, Callable],
    columns: int,
    conv_tail: tuple[int, int],
    state_tail: tuple[int, ...],
    after: tuple,
    num_lanes: int,
    dtype,
    batch: int,
) -> Case:
    """A fused decode op `fn(mixed, weight, bias, conv_state, state, *after, read, write)`. Its two
    pools travel packed into one fp32 [S, conv + state] array, so the judge checks both (a bf16
    conv window round-trips through fp32 exactly)."""
    read, write, num_slots = lanes(rng, batch, num_lanes)
    split = conv_tail[0] * conv_tail[1]

    def call(fn, mixed, weight, bias, packed, *rest, **kw):
        conv_state = packed[:, :split].reshape(-1, *conv_tail).astype(dtype)
        state = packed[:, split:].reshape(-1, *state_tail)
        out, conv_state, state = fn(mixed, weight, bias, conv_state, state, *rest, **kw)
        flat = (
            conv_state.astype(F32).reshape(packed.shape[0], -1),
            state.reshape(packed.shape[0], -1),
        )
        return out, jnp.concatenate(flat, axis=1)

    conv_pool = np.asarray(_pool(rng, num_slots, conv_tail, dtype), np.float32)
    state_pool = _pool(rng, num_slots, state_tail, F32)
    packed = np.concatenate([p.reshape(num_slots, -1) for p in (conv_pool, state_pool)], axis=1)
    channels, width = conv_tail[0], conv_tail[1] + 1
    args = (
        _normal(rng, (batch, num_lanes, columns), dtype),
        _normal(rng, (channels, width), dtype, width**-0.5),
        _normal(rng, (channels,), dtype, 0.1),
        packed,
        *after,
        read,
        write,
    )
    return Case(
        functools.partial(call, fns[0]),
        functools.partial(call, fns[1]),
        args,
        3,
        _lane_live(write, 2),
        write.ravel(),
        TOLERANCE[dtype, "update"],
        f"B={batch} L={num_lanes}",
    )


def _with_d(fn: Callable) -> Callable:
    """mamba2_decode with D and dt_bias positional after A (as `_fused_decode_case` calls it)."""

    def call(zxbcdt, weight, bias, conv_state, ssm_state, a, d, dt_bias, read, write, **kw):
        return fn(
            zxbcdt, weight, bias, conv_state, ssm_state, a, read, write, D=d, dt_bias=dt_bias, **kw
        )

    return call


def mamba2_decode(
    heads: int,
    head_dim: int,
    groups: int,
    state: int,
    width: int,
    num_lanes: int,
    dtype,
    batch: int = 6,
) -> Shape:
    d_inner = heads * head_dim
    conv_dim = d_inner + 2 * groups * state

    def build(rng) -> Case:
        after = (
            -np.exp(_normal(rng, (heads,), F32, 0.5)),
            _normal(rng, (heads,)),
            _normal(rng, (heads,), F32, 0.5),
        )
        fns = (_with_d(m2d.mamba2_decode), _with_d(ssd_ref.mamba2_decode_reference))
        tails = (conv_dim, width - 1), (heads, head_dim, state)
        return _fused_decode_case(
            rng, fns, d_inner + conv_dim + heads, *tails, after, num_lanes, dtype, batch
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} W={width} L={num_lanes}"
    return Shape(f"mamba2_decode {dims} {jnp.dtype(dtype).name}", build)


def gdn_decode(
    hk: int, hv: int, k: int, v: int, width: int, num_lanes: int, dtype, batch: int = 6
) -> Shape:
    conv_dim = 2 * hk * k + hv * v

    def build(rng) -> Case:
        after = (_normal(rng, (hv,), F32, 0.5), _normal(rng, (hv,), F32, 0.5))
        fns = (gdnd.gdn_decode, gdn_ref.gdn_decode_reference)
        return _fused_decode_case(
            rng,
            fns,
            conv_dim + hv * v + 2 * hv,
            (conv_dim, width - 1),
            (hv, v, k),
            after,
            num_lanes,
            dtype,
            batch,
        )

    dims = f"HK={hk} HV={hv} K={k} V={v} W={width} L={num_lanes}"
    return Shape(f"gdn_decode {dims} {jnp.dtype(dtype).name}", build)


def gdn_chunk(hk: int, hv: int, k: int, v: int, dtype, chunk: int = 64) -> Shape:
    def build(rng) -> Case:
        rows = varlen(rng, _lengths(chunk), chunk)
        t = rows.num_tokens
        args = (
            _normal(rng, (t, hk, k), dtype),
            _normal(rng, (t, hk, k), dtype),
            _normal(rng, (t, hv, v), dtype),
            -np.logaddexp(0.0, _normal(rng, (t, hv))).astype(np.float32),
            1.0 / (1.0 + np.exp(-_normal(rng, (t, hv)))),
            _pool(rng, rows.num_slots, (hv, v, k), F32),
            Rows(
                rows.qsl,
                rows.num_computed,
                rows.has_init,
                rows.read,
                rows.write,
                rows.boundary,
                chunk,
            ),
        )

        def call(fn, *a, **kw):
            return fn(*a, chunk_size=chunk, **kw)

        return Case(
            functools.partial(call, gdnc.gdn_chunk),
            functools.partial(call, gdn_ref.gdn_chunk_reference),
            args,
            5,
            rows.live[:, None, None],
            rows.written,
            TOLERANCE[dtype, "scan"],
            rows.describe(),
        )

    return Shape(
        f"gdn_chunk HK={hk} HV={hv} K={k} V={v} chunk={chunk} {jnp.dtype(dtype).name}", build
    )


def gdn_update(hk: int, hv: int, k: int, v: int, num_lanes: int, dtype, batch: int = 6) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        lead = (batch, num_lanes)
        args = (
            _normal(rng, (*lead, hk, k), dtype),
            _normal(rng, (*lead, hk, k), dtype),
            _normal(rng, (*lead, hv, v), dtype),
            _normal(rng, (*lead, hv), dtype),
            _normal(rng, (*lead, hv), dtype),
            _normal(rng, (hv,), F32, 0.5),
            _normal(rng, (hv,), F32, 0.5),
            _pool(rng, num_slots, (hv, v, k), F32),
            read,
            write,
        )
        return Case(
            gdnu.gdn_state_update,
            gdn_ref.gdn_state_update_reference,
            args,
            7,
            _lane_live(write, 2),
            write.ravel(),
            TOLERANCE[dtype, "update"],
            f"B={batch} L={num_lanes}",
        )

    return Shape(
        f"gdn_state_update HK={hk} HV={hv} K={k} V={v} L={num_lanes} {jnp.dtype(dtype).name}", build
    )


def paged_decode(
    width: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    contexts: tuple[int, ...],
) -> Shape:
    """Decode rows of `width` lanes at the given context lengths (the last lane of each row dead
    when width > 1), a padding row, NaN in the NULL block; the caches play the pool's part: no
    block may change and block 0 stays NaN."""

    def build(rng) -> Case:
        rows = len(contexts) + 1
        max_blocks = -(-max(contexts) // block_size)
        num_blocks = rows * max_blocks + 2
        table = np.zeros((rows, max_blocks), np.int32)
        free = list(rng.permutation(np.arange(1, num_blocks)))
        seq_lens, query_lens = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for r, length in enumerate(contexts):
            n = -(-length // block_size)
            table[r, :n] = [free.pop() for _ in range(n)]
            seq_lens[r], query_lens[r] = length, max(1, min(width - 1, length))
        cache = (num_blocks, block_size, kv_heads, head_dim)
        k, v = _pool(rng, num_blocks, cache[1:], dtype), _pool(rng, num_blocks, cache[1:], dtype)
        args = (
            _normal(rng, (rows, width, heads, head_dim), dtype),
            k,
            v,
            table,
            seq_lens,
            query_lens,
        )
        scale = head_dim**-0.5

        def kernel(*a, interpret):
            return pda.paged_decode_attention(*a, scale=scale, interpret=interpret), a[1]

        def reference(*a):
            return attention_ref.paged_decode_attention_reference(*a, scale=scale), a[1]

        live = (np.arange(width)[None, :] < query_lens[:, None])[:, :, None, None]
        return Case(
            kernel,
            reference,
            args,
            1,
            live,
            np.zeros(0, np.int32),
            TOLERANCE[dtype, "update"],
            f"contexts={list(contexts)} W={width}",
        )

    return Shape(
        f"paged_decode_attention Hq={heads} Hkv={kv_heads} D={head_dim} bs={block_size} "
        f"W={width} {jnp.dtype(dtype).name}",
        build,
    )


def _grouped_matmul_oracle(lhs, rhs, group_sizes, out_dtype):
    """Every row times every group's weights ([G, M, N], fp32 at full precision), then each row
    picks its own group's product: no ragged_dot, and empty groups' NaN weights reach no row."""
    ends = jnp.cumsum(group_sizes)
    row = jnp.arange(lhs.shape[0])
    group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), rhs.shape[0] - 1)
    every = jnp.einsum("mk,gkn->gmn", lhs.astype(F32), rhs.astype(F32), precision="highest")
    return jnp.where((row < ends[-1])[:, None], every[group, row], 0.0).astype(out_dtype)


def grouped_matmul(k: int, n: int, groups: int, dtype, out_dtype=F32) -> Shape:
    """MoE experts: groups of 0 to 19 rows (about 40% empty), one group of 37 rows (several row
    tiles), 5 rows in no group (NaN: never read, output 0). Group 0 is empty and its weights are
    NaN (the pool's NULL slot): an empty group's weights are never read. Needs groups >= 2."""

    def build(rng) -> Case:
        sizes = rng.integers(0, 20, groups).astype(np.int32)
        sizes[rng.random(groups) < 0.4] = 0
        sizes[0], sizes[-1] = 0, 37
        num_rows = int(sizes.sum()) + 5
        lhs = np.array(_normal(rng, (num_rows, k), dtype, k**-0.5))
        lhs[-5:] = np.nan
        args = (lhs, _pool(rng, groups, (k, n), dtype), sizes)

        def kernel(*a, interpret):
            return gmm.grouped_matmul(*a, out_dtype=out_dtype, interpret=interpret), a[1]

        def reference(*a):
            return _grouped_matmul_oracle(*a, out_dtype), a[1]

        live = (np.arange(num_rows) < sizes.sum())[:, None]
        tol = TOLERANCE[out_dtype, "update"]  # bf16 products are exact in fp32
        return Case(
            kernel,
            reference,
            args,
            1,
            live,
            np.zeros(0, np.int32),
            tol,
            f"M={num_rows} groups with rows={int(np.sum(sizes > 0))}",
        )

    dtypes = f"{jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name}"
    return Shape(f"grouped_matmul K={k} N={n} G={groups} {dtypes}", build)


def grid(quick: bool) -> list[Shape]:
    """The grid: each odd dimension at least once per kernel (quick: 1-2 small shapes each)."""
    if quick:
        return [
            conv_prefill(37, 4, F32, walk_tokens=8),
            conv_update(37, 4, 3, BF16),
            ssd_scan("sequential", 5, 12, 1, 24, F32, 16),
            ssd_scan("parallel", 6, 24, 3, 16, BF16, 16),
            ssd_update(5, 12, 1, 16, 2, F32),
            mamba2_decode(6, 24, 3, 24, 3, 2, BF16),
            gdn_chunk(1, 2, 24, 12, F32, chunk=16),
            gdn_update(1, 2, 24, 12, 2, BF16),
            gdn_decode(1, 2, 24, 12, 4, 2, F32),
            paged_decode(2, 6, 3, 24, 8, F32, (1, 9, 30)),
            grouped_matmul(24, 12, 5, BF16),
        ]
    ssd_dims = [
        (5, 12, 1, 16, F32, 128),
        (6, 24, 2, 48, BF16, 256),
        (10, 48, 2, 128, F32, 256),
        (1, 64, 1, 24, BF16, 128),
        (6, 80, 3, 64, F32, 128),
        (5, 96, 1, 128, BF16, 256),
        (10, 128, 2, 64, F32, 128),
    ]
    ssu_dims = [
        (5, 12, 1, 16, 1, F32),
        (6, 24, 2, 48, 3, BF16),
        (10, 48, 2, 128, 2, F32),
        (1, 64, 1, 24, 1, BF16),
        (6, 80, 3, 64, 4, F32),
        (5, 96, 1, 128, 1, BF16),
        (10, 128, 2, 64, 2, F32),
    ]
    gdn_dims = [
        (1, 1, 24, 80, F32),
        (5, 10, 12, 96, BF16),
        (2, 6, 48, 64, F32),
        (3, 6, 80, 24, BF16),
        (1, 5, 96, 128, F32),
        (6, 6, 128, 12, BF16),
        (2, 10, 64, 48, F32),
    ]
    return [
        conv_prefill(37, 4, F32),
        conv_prefill(1000, 4, BF16, walk_tokens=128),
        conv_prefill(200, 3, F32, walk_tokens=4),
        conv_update(37, 4, 1, F32),
        conv_update(1000, 4, 3, BF16),
        *(ssd_scan(a, *d) for a in ssd_ref.ALGORITHMS for d in ssd_dims),
        # Output programs serving several heads of a group (3 of 3, 5 of 5).
        ssd_scan("parallel", 6, 24, 2, 48, BF16, 256, heads_per_program=3),
        ssd_scan("parallel", 10, 48, 2, 128, F32, 256, heads_per_program=5),
        *(ssd_update(*d) for d in ssu_dims),
        mamba2_decode(5, 12, 1, 16, 4, 1, F32),
        mamba2_decode(6, 24, 3, 24, 3, 2, BF16),
        mamba2_decode(6, 80, 2, 16, 2, 3, F32),
        mamba2_decode(10, 48, 2, 128, 4, 4, BF16),
        mamba2_decode(64, 64, 8, 128, 4, 1, BF16),  # the bench model's layer
        *(gdn_chunk(*d) for d in gdn_dims),
        # The chain's pipeline stages at K = 128 (shared memory bound): fp32 tiles at chunk 64,
        # bf16 at chunk 128.
        gdn_chunk(1, 2, 128, 128, F32),
        gdn_chunk(2, 4, 128, 128, BF16, chunk=128),
        *(gdn_update(*d[:4], 1 + i % 3, d[4]) for i, d in enumerate(gdn_dims)),
        gdn_decode(1, 1, 24, 80, 4, 1, F32),
        gdn_decode(5, 10, 12, 96, 3, 2, BF16),
        gdn_decode(3, 6, 80, 24, 2, 3, F32),
        gdn_decode(2, 6, 128, 48, 4, 4, BF16),
        gdn_decode(16, 32, 128, 128, 4, 1, BF16),  # a Qwen3-Next-shaped layer
        paged_decode(1, 16, 4, 128, 16, BF16, (1, 17, 1000, 8200)),
        paged_decode(3, 6, 3, 24, 8, F32, (1, 9, 300, 4100)),
        paged_decode(2, 5, 1, 80, 32, BF16, (2, 63, 5000)),
        paged_decode(4, 10, 5, 12, 16, F32, (1, 33, 700)),
        grouped_matmul(24, 12, 5, F32),
        grouped_matmul(80, 96, 7, BF16),
        grouped_matmul(80, 96, 7, BF16, BF16),
        grouped_matmul(2048, 512, 24, BF16),  # Qwen3-Next's up / gate shape, fewer experts
        grouped_matmul(512, 2048, 24, F32),  # and its down shape
    ]


# ----------------------------------------------------------------------------- running


def _in_daemon_thread(fn: Callable) -> concurrent.futures.Future:
    """Run fn in a daemon thread (a hung kernel must not keep the process alive at exit)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def target():
        try:
            future.set_result(fn())
        except BaseException as e:  # reported by the caller
            future.set_exception(e)

    threading.Thread(target=target, daemon=True).start()
    return future


def _compile_all(cases: list[Case], workers: int) -> list[concurrent.futures.Future]:
    """Compile every kernel and reference ahead of time, `workers` at a time."""
    gate = threading.Semaphore(workers)

    def compile_one(case: Case):
        with gate:
            start = time.perf_counter()
            kernel = functools.partial(case.kernel, interpret=not on_gpu())
            kernel = jax.jit(kernel).lower(*case.args).compile()
            reference = jax.jit(case.reference).lower(*case.args).compile()
            return kernel, reference, time.perf_counter() - start

    return [_in_daemon_thread(functools.partial(compile_one, c)) for c in cases]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def judge(case: Case, out, pool, ref) -> tuple[bool, str]:
    """Errors of one run against its reference, and the invariants every op keeps."""
    out, pool, ref_out, ref_pool = (np.asarray(a, np.float32) for a in (out, pool, *ref))
    pool_in = np.asarray(case.args[case.pool_index], np.float32)
    live = np.broadcast_to(case.live, out.shape)
    written = np.unique(case.written[case.written > 0])
    kept = np.setdiff1d(np.arange(1, pool.shape[0]), written)
    err_out = _rel(out[live], ref_out[live])
    err_state = _rel(pool[written], ref_pool[written])
    problems = []
    if not (np.isfinite(out).all() and np.isfinite(pool[1:]).all()):
        problems.append("NaN/inf")
    if np.any(out[~live] != 0):
        problems.append("padding output not 0")
    if not np.isnan(pool[0]).all():
        problems.append("slot 0 written")
    if pool[kept].tobytes() != pool_in[kept].tobytes():
        problems.append("an unwritten slot changed")
    ok = not problems and err_out <= case.tol and err_state <= case.tol
    detail = f"out {err_out:.1e} state {err_state:.1e} (tol {case.tol:.0e}) {case.layout}"
    return ok, detail + "".join(f"; {p}" for p in problems)


def _check(shape: Shape, case: Case, compiled: concurrent.futures.Future, deadline: float) -> Check:
    """Wait for the shape's compile, run the kernel under RUN_LIMIT_S, judge it against the
    reference. Raises TimeoutError("run") when the kernel does not finish."""
    try:
        kernel, reference, seconds = compiled.result(timeout=max(1.0, deadline - time.time()))
    except concurrent.futures.TimeoutError:
        return Check(shape.name, False, f"compile did not finish within {COMPILE_LIMIT_S:.0f} s")
    print(f"  compiled in {seconds:.1f} s", flush=True)
    start = time.perf_counter()
    running = _in_daemon_thread(functools.partial(_block, kernel, case.args))
    try:
        out, pool = running.result(timeout=RUN_LIMIT_S)
    except concurrent.futures.TimeoutError:
        raise TimeoutError("run") from None
    run_ms = (time.perf_counter() - start) * 1e3
    ok, detail = judge(case, out, pool, _block(reference, case.args))
    return Check(shape.name, ok, f"{detail}; compile {seconds:.0f} s, run {run_ms:.0f} ms")


def _block(fn: Callable, args: tuple):
    return jax.block_until_ready(fn(*args))


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every kernel against its reference on the odd-shape grid (`families` does not apply)."""
    del families
    seed = int(os.environ.get("JMAMBA_CHECK_SEED", secrets.randbelow(2**31)))
    print(f"kernel grid: seed {seed} (set JMAMBA_CHECK_SEED to repeat it)", flush=True)
    shapes = grid(quick)
    cases = [s.build(np.random.default_rng(seed + i)) for i, s in enumerate(shapes)]
    start = time.perf_counter()
    compiled = _compile_all(cases, workers=min(16, os.cpu_count() or 1))
    deadline = time.time() + COMPILE_LIMIT_S
    checks: list[Check] = []
    hung = False
    for shape, case, future in zip(shapes, cases, compiled, strict=True):
        if hung:  # the device is stuck behind the hung kernel: say so instead of waiting again
            checks.append(Check(shape.name, False, "not run: an earlier kernel hung"))
            continue
        print(f"kernel grid: {shape.name}", flush=True)
        try:
            checks.append(_check(shape, case, future, deadline))
        except TimeoutError:
            hung = True
            checks.append(Check(shape.name, False, f"hung: no result within {RUN_LIMIT_S:.0f} s"))
        except Exception as e:  # a failure to compile or run is a failed check, not a crash
            checks.append(Check(shape.name, False, f"{type(e).__name__}: {str(e)[:300]}"))
    done = [f.result()[2] for f in compiled if f.done() and not f.exception()]
    wall = time.perf_counter() - start
    longest = max(done, default=0.0)
    print(
        f"kernel grid: {len(cases)} shapes in {wall:.0f} s wall; {len(done)} compiles took "
        f"{sum(done):.0f} s in all, the longest {longest:.0f} s",
        flush=True,
    )
    return checks
