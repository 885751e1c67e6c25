"""The Gated DeltaNet chunk (prefill) at the bench shape (16 key / 32 value heads, d 128), its
tuning configs, and its anchor: FLA's `chunk_gated_delta_rule`."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import input_sets, log
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
from pallas_kernels.gdn import chain_mgpu as hopper
from pallas_kernels.gdn import chunk as gdn
from pallas_kernels.gdn import reference as gdn_ref

HK, HV, DK = 16, 32, 128
GDN_CONFIGS = [
    dict(),
    dict(intra_num_warps=8),
    dict(intra_num_warps=2),
    dict(split_intra=True),
    dict(solve_block=32),
    dict(block_v=32),
    dict(hopper=True),
]


def gdn_inputs(rng, batch: int, seqlen: int, hk=HK, hv=HV, dk=DK) -> dict:
    T = batch * seqlen
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(
        q=f(T, hk, dk),
        k=f(T, hk, dk),
        v=f(T, hv, dk),
        g=np.log(1 / (1 + np.exp(-f(T, hv)))),
        beta=1 / (1 + np.exp(-f(T, hv))),
        init=f(batch, hv, dk, dk) * 0.1,
    )


def gdn_case(batch: int, seqlen: int, quick: bool) -> Case:
    rng = np.random.default_rng(2)
    d = gdn_inputs(rng, batch, seqlen, *((2, 4, 16) if quick else ()))
    q, k, v = (jnp.asarray(d[n], BF) for n in ("q", "k", "v"))
    g, beta = jnp.asarray(d["g"]), jnp.asarray(d["beta"])
    sets = input_sets((q, k, v, g, beta), 1 if quick else CALLS)
    pool = slot_pool(d["init"])
    rows = rows_meta(batch, seqlen)
    reference = functools.partial(gdn_ref.gdn_chunk_reference, q, k, v, g, beta)
    ref = functools.cache(lambda: jax.jit(lambda p: reference(p, rows))(pool))

    def make_step(cfg):
        knobs = dict(cfg)
        if knobs.pop("hopper", False):  # the Mosaic GPU chain (the models' path on Hopper)
            return lambda i, p, sets: hopper.gdn_chunk_hopper(*sets[i % len(sets)], p, rows)
        tuning = gdn.ChunkTuning(**knobs)
        return lambda i, p, sets: gdn.gdn_chunk(
            *sets[i % len(sets)], p, rows, interpret=quick, tuning=tuning
        )

    def anchor(anchors):
        torch, triton = anchors[:2]
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        t = {n: torch.from_numpy(a).cuda() for n, a in d.items()}
        bf = {n: t[n].to(torch.bfloat16)[None] for n in ("q", "k", "v")}
        cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
        call = functools.partial(
            chunk_gated_delta_rule,
            bf["q"],
            bf["k"],
            bf["v"],
            t["g"][None],
            t["beta"][None],
            initial_state=t["init"],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=True,
            cu_seqlens=cu if batch > 1 else None,
        )
        t0 = time.time()
        o_a, s_a = call()
        torch.cuda.synchronize()
        log(f"FLA chunk_gated_delta_rule first call {time.time() - t0:.1f} s")
        us = bench_graph(torch, triton, call)
        return anchor_fields("FLA 0.6.0 chunk_gated_delta_rule (graph)", us, o_a, s_a, ref)

    nbytes = (
        batch * seqlen * ((2 * q.shape[1] + 2 * v.shape[1]) * q.shape[2] * 2 + 2 * v.shape[1] * 4)
    )
    nbytes += 2 * batch * int(np.prod(pool.shape[1:])) * 4
    return Case("gdn_chunk", make_step, pool, sets, pool_check(pool, ref), nbytes, CALLS, anchor)
