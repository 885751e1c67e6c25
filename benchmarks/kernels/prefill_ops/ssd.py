"""The SSD chunk scan (Mamba2 prefill) at the bench shape (128 heads, P 64, N 128, 8 groups, chunk
256), its tuning configs, and its anchor: mamba_ssm's `mamba_chunk_scan_combined`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import input_sets
from benchmarks.kernels.anchors import bench_graph
from benchmarks.kernels.prefill_ops.case import (
    BF,
    CALLS,
    Case,
    anchor_fields,
    pool_check,
    rows_meta,
    slot_pool,
)
from pallas_kernels.ssd import chunk_scan as scan
from pallas_kernels.ssd import reference as scan_ref
from pallas_kernels.ssd import sequential_mgpu as hopper

H, P, N, G = 128, 64, 128, 8
SSD_OUTPUT = dict(
    algorithm="parallel", block_q=64, block_k=16, num_warps=4, num_stages=3, heads_per_program=2
)  # the output kernel's tuned defaults (issue 14)
SSD_CONFIGS = [
    # the chunk-state kernel: tokens per step, warps (the default first)
    *(
        dict(SSD_OUTPUT, state_block_q=q, state_warps=w)
        for q, w in ((32, 4), (64, 4), (16, 4), (32, 8))
    ),
    dict(algorithm="sequential", seq_block_q=32),
    dict(algorithm="sequential", hopper=True),  # the models' path on sm_90 (bf16, P 64)
]


def ssd_inputs(rng, batch: int, seqlen: int, heads=H, head_dim=P, groups=G, state=N) -> dict:
    T = batch * seqlen
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(
        x=f(T, heads, head_dim),
        dt=f(T, heads) - 2.0,
        A=-np.exp(f(heads) * 0.5),
        B=f(T, groups, state),
        C=f(T, groups, state),
        D=f(heads),
        dt_bias=f(heads) * 0.5,
        init=f(batch, heads, head_dim, state) * 0.1,
    )


def ssd_case(batch: int, seqlen: int, quick: bool) -> Case:
    rng = np.random.default_rng(1)
    d = ssd_inputs(rng, batch, seqlen, *((4, 16, 2, 16) if quick else ()))
    x, dt, bm, cm = (jnp.asarray(d[k], BF) for k in ("x", "dt", "B", "C"))
    A, Dk, bias = (jnp.asarray(d[k]) for k in ("A", "D", "dt_bias"))
    sets = input_sets((x, dt, A, bm, cm), 1 if quick else CALLS)
    pool = slot_pool(d["init"])
    rows = rows_meta(batch, seqlen)
    kw = dict(D=Dk, dt_bias=bias, chunk_size=32 if quick else 256)
    reference = functools.partial(scan_ref.ssd_chunk_scan_reference, x, dt, A, bm, cm)
    ref = functools.cache(lambda: jax.jit(lambda p: reference(p, rows, **kw))(pool))

    def make_step(cfg):
        knobs = dict(cfg)
        algorithm = knobs.pop("algorithm")
        if knobs.pop("hopper", False):  # the Mosaic GPU kernel the models run on an H100
            return lambda i, p, sets: hopper.ssd_chunk_scan_hopper(
                *sets[i % len(sets)], p, rows, **kw, algorithm=algorithm
            )
        tuning = scan.ScanTuning(**knobs)
        return lambda i, p, sets: scan.ssd_chunk_scan(
            *sets[i % len(sets)], p, rows, **kw, interpret=quick, algorithm=algorithm, tuning=tuning
        )

    def anchor(anchors):
        torch, triton, _, chunk_combined = anchors
        t = {k: torch.from_numpy(v).cuda() for k, v in d.items()}
        bf = {
            k: t[k].to(torch.bfloat16).view(batch, seqlen, *v.shape[1:])
            for k, v in d.items()
            if k in ("x", "dt", "B", "C")
        }
        call = functools.partial(
            chunk_combined,
            bf["x"],
            bf["dt"],
            t["A"],
            bf["B"],
            bf["C"],
            256,
            D=t["D"],
            dt_bias=t["dt_bias"],
            initial_states=t["init"],
            dt_softplus=True,
            return_final_states=True,
        )
        y_a, s_a = call()
        us = bench_graph(torch, triton, call)
        return anchor_fields("mamba_ssm mamba_chunk_scan_combined (graph)", us, y_a, s_a, ref)

    nbytes = (
        batch
        * seqlen
        * (2 * x.shape[1] * x.shape[2] * 2 + 2 * bm.shape[1] * bm.shape[2] * 2 + 2 * x.shape[1])
    )
    nbytes += 2 * batch * int(np.prod(pool.shape[1:])) * 4
    return Case(
        "ssd_chunk_scan", make_step, pool, sets, pool_check(pool, ref), nbytes, CALLS, anchor
    )
