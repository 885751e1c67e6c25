"""Mamba2 SSD prefill over ragged `Rows`, with slot-indexed initial, final and boundary states.

The op and its two algorithms; the recurrence, glossary and definition are in `ssd/reference.py`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2, sds_like
from pallas_kernels.rows import Rows
from pallas_kernels.ssd import chunk_kernels as _k
from pallas_kernels.ssd.reference import check_scan_args
from pallas_kernels.ssd.sequential import sequential_scan


@dataclasses.dataclass(frozen=True)
class ScanTuning:
    """Launch knobs of the SSD scan kernels. Static: from code or a model's config, never from
    the batch (several change how a row's sums are grouped, hence its rounding).

    Sequential kernel: `seq_block_q` tokens per inner chunk (divides chunk_size), `block_p` head-dim
    rows per program, `num_warps`. Parallel kernels: `state_chunk` (divides chunk_size; default
    chunk_size), outputs and C B^T in blocks of `block_q` tokens, the output's sum over earlier
    tokens in tiles of `block_k` (divides block_q; None = block_q), `block_p`, `pass_block_n` state
    columns per pass program and its `pass_stages` (loads of the next chunk state in flight),
    `num_warps` / `num_stages` of the output kernel, `state_warps` and `state_block_q` (tokens
    per step; 32 beat 64 on the H100, benchmarks/results/README.md) of the chunk-state kernel,
    `heads_per_program` heads of one group per output program (they load the group's C rows and
    C B^T tiles once; the largest divisor of the heads per group not above it is used; each head's
    sums are the same either way).
    """

    seq_block_q: int = 32
    block_p: int = 64
    num_warps: int = 4
    state_chunk: int | None = None
    block_q: int = 64
    block_k: int | None = 16
    pass_block_n: int = 64
    pass_stages: int = 1
    num_stages: int = 3
    state_warps: int = 4
    state_block_q: int = 32
    heads_per_program: int = 2


@functools.partial(
    jax.jit,
    static_argnames=(
        "dt_softplus",
        "dt_limit",
        "chunk_size",
        "algorithm",
        "tuning",
        "interpret",
    ),
)
def ssd_chunk_scan(
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
    tuning: ScanTuning = ScanTuning(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernels for `ssd_chunk_scan_reference` (same arguments and results).

    `algorithm`: "sequential" (`ssd/sequential.py`: one program per row, head and P-block walks the
    row's chunks) or "parallel" (`ssd/chunk_kernels.py`: chunk states in parallel over (head,
    chunk), a sequential pass over the chunk states of each row, C B^T once per group and chunk,
    then the outputs in parallel over (head, token block); extra memory fp32 [NC, H, P, N] chunk
    states and the same in x's dtype for the states entering each chunk, fp32 [NC, G, Q, Q] C B^T,
    fp32 [H, T] dt' and cumulative decay, NC = T // Q + 2R). The two round differently, so the
    choice must never depend on the batch (docs/architecture.md 5.8: a request's output may not
    depend on how many prefills share its step); it comes from the model's config
    (`Mamba2Config.scan_algorithm`). Sequential is the models' default: on the H200 it is the
    faster at 8 rows x 2048 tokens and the slower at 1 x 8192 (benchmarks/results/README.md;
    changing a model's algorithm changes its rounding: check its fixtures on the GPU first).
    Chunks end at absolute multiples of their size (a divisor of `chunk_size`) in both. These are
    the Triton kernels; on an H100 the dispatched op runs the sequential algorithm in Mosaic GPU
    where it applies (`ssd/sequential_mgpu.py`).
    """
    check_scan_args(x, dt, A, B, C, ssm_state, rows, D, z, dt_bias, chunk_size, algorithm)
    zeros = jnp.zeros((x.shape[1],), jnp.float32)
    D = zeros if D is None else D
    dt_bias = zeros if dt_bias is None else dt_bias
    args = (rows.int32_operands(), x, dt, A, B, C, D, z, dt_bias, ssm_state)
    low, high = dt_limit  # a tuple, also where a caller passed a list
    if algorithm == "parallel":
        return _parallel_scan(
            *args,
            chunk_size,
            tuning,
            dt_softplus=dt_softplus,
            dt_limit=(low, high),
            block_size=rows.block_size,
            interpret=interpret,
        )
    block_q = _token_block("chunk_size", chunk_size, "seq_block_q", tuning.seq_block_q)
    block_p = max(16, min(pow2(tuning.block_p), pow2(x.shape[2])))
    return sequential_scan(
        *args,
        dt_softplus=dt_softplus,
        dt_limit=(low, high),
        block_size=rows.block_size,
        interpret=interpret,
        block_q=block_q,
        block_p=block_p,
        num_warps=tuning.num_warps,
        num_stages=1,
    )


def _token_block(chunk_name: str, chunk: int, knob: str, value: int) -> int:
    """A kernel's tokens per step: `value` as a power of two in [16, pow2(chunk)], which must
    divide the chunk (a ValueError names both knobs otherwise)."""
    q = max(16, min(pow2(value), pow2(chunk)))
    if chunk % q:
        raise ValueError(f"{chunk_name}={chunk} must be a multiple of {knob}={q}")
    return q


def _parallel_scan(
    meta,
    x,
    dt,
    A,
    B,
    C,
    D,
    z,
    dt_bias,
    ssm_state,
    chunk_size: int,
    tuning: ScanTuning,
    *,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    block_size: int | None,
    interpret: bool,
):
    """The four launches of `chunk_kernels`; meta = `Rows.int32_operands()`."""
    num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[1], B.shape[2]
    qsl, nc = meta[0], meta[1]
    num_rows = qsl.shape[0] - 1
    chunk = chunk_size if tuning.state_chunk is None else tuning.state_chunk
    if chunk_size % chunk:
        raise ValueError(f"state_chunk={chunk} must divide chunk_size={chunk_size}")
    block_q = _token_block("state_chunk", chunk, "block_q", tuning.block_q)
    state_q = _token_block("state_chunk", chunk, "state_block_q", tuning.state_block_q)
    block_k = block_q if tuning.block_k is None else max(16, min(pow2(tuning.block_k), block_q))
    block_p = max(16, min(pow2(tuning.block_p), pow2(head_dim)))
    block_n = max(16, pow2(state_size))
    pass_block_n = max(16, min(pow2(tuning.pass_block_n), block_n))
    t0, n, cstart, nch = _k.chunk_table(qsl, nc, num_tokens, chunk)
    num_chunks, p_blocks = t0.shape[0], pl.cdiv(head_dim, block_p)
    shape = dict(head_dim=head_dim, state_size=state_size)
    f32 = jnp.float32

    def params(warps, stages=1):
        return plgpu.CompilerParams(num_warps=warps, num_stages=stages)

    states, cum, dtp = pl.pallas_call(
        functools.partial(
            _k.state_kernel,
            heads_per_group=heads // groups,
            block_q=state_q,
            block_p=block_p,
            block_n=block_n,
            dt_softplus=dt_softplus,
            dt_limit=dt_limit,
            **shape,
        ),
        out_shape=(
            jax.ShapeDtypeStruct((num_chunks, heads, head_dim, state_size), f32),
            jax.ShapeDtypeStruct((heads, num_tokens), f32),
            jax.ShapeDtypeStruct((heads, num_tokens), f32),
        ),
        grid=(heads, num_chunks, p_blocks),
        compiler_params=params(tuning.state_warps, tuning.num_stages),
        interpret=interpret,
        name="ssd_chunk_state",
    )(t0, n, x, dt, A, B, dt_bias)

    entering, pool, y = pl.pallas_call(
        functools.partial(
            _k.pass_kernel,
            num_rows=num_rows,
            num_tokens=num_tokens,
            block_t=32,
            block_p=max(16, pow2(head_dim)),
            block_n=pass_block_n,
            block_size=block_size,
            **shape,
        ),
        out_shape=(
            jax.ShapeDtypeStruct(states.shape, x.dtype),
            sds_like(ssm_state),
            sds_like(x),
        ),
        grid=(num_rows + 1, heads, pl.cdiv(state_size, pass_block_n)),
        input_output_aliases={12: 1},
        compiler_params=params(4, tuning.pass_stages),
        interpret=interpret,
        name="ssd_state_pass",
    )(*meta, cstart, nch, t0, n, cum, states, ssm_state)

    blocks_per_chunk = chunk // block_q
    heads_per_group = heads // groups
    per_program = max(
        d
        for d in range(1, heads_per_group + 1)
        if heads_per_group % d == 0 and d <= max(1, tuning.heads_per_program)
    )
    cb = pl.pallas_call(
        functools.partial(
            _k.cb_kernel,
            state_size=state_size,
            blocks_per_chunk=blocks_per_chunk,
            block_q=block_q,
            block_n=block_n,
            dot_dtype=x.dtype,
        ),
        out_shape=jax.ShapeDtypeStruct((num_chunks, groups, chunk, chunk), f32),
        grid=(num_chunks, groups, blocks_per_chunk * blocks_per_chunk),
        compiler_params=params(4),
        interpret=interpret,
        name="ssd_chunk_cb",
    )(t0, n, B, C)

    return pl.pallas_call(
        functools.partial(
            _k.output_kernel,
            heads_per_group=heads_per_group,
            heads_per_program=per_program,
            blocks_per_chunk=blocks_per_chunk,
            block_q=block_q,
            block_k=block_k,
            block_p=block_p,
            block_n=block_n,
            has_z=z is not None,
            **shape,
        ),
        out_shape=sds_like(x),
        grid=(heads // per_program, num_chunks * blocks_per_chunk, p_blocks),
        input_output_aliases={10: 0},
        compiler_params=params(tuning.num_warps, tuning.num_stages),
        interpret=interpret,
        name="ssd_chunk_output",
    )(t0, n, x, cum, dtp, cb, C, D, x if z is None else z, entering, y), pool
