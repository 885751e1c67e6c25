"""The causal conv1d prefill at the bench shape (D 8192, W 4), its tuning configs, and its anchor:
FLA's `causal_conv1d` (Triton backend)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import input_sets, rel_err
from benchmarks.kernels.anchors import bench_graph
from benchmarks.kernels.prefill_ops.case import BF, Case, rows_meta
from pallas_kernels.conv import prefill as conv
from pallas_kernels.conv import reference as conv_ref

D_CONV, W = 8192, 4
CONV_CONFIGS = [
    *(
        dict(walk_tokens=wt, block_d=bd, unroll=u, num_warps=nw)
        for wt, bd, u, nw in (
            (128, 1024, 4, 4),
            (64, 1024, 4, 4),
            (128, 1024, 8, 4),
            (256, 1024, 8, 4),
            (128, 2048, 4, 8),
            (128, 512, 4, 4),
            (64, 512, 4, 2),
            (256, 2048, 8, 8),
        )
    ),
]


def conv_case(batch: int, seqlen: int, quick: bool) -> Case:
    rng = np.random.default_rng(3)
    channels = 40 if quick else D_CONV
    T = batch * seqlen
    xn = rng.standard_normal((T, channels), np.float32)
    wt = rng.standard_normal((channels, W), np.float32) * 0.5
    bs = rng.standard_normal(channels, np.float32)
    x, w, b = jnp.asarray(xn, BF), jnp.asarray(wt, BF), jnp.asarray(bs, BF)
    state = jnp.asarray(rng.standard_normal((2 * batch + 1, channels, W - 1), np.float32), BF)
    rows = rows_meta(batch, seqlen)
    reference = functools.partial(conv_ref.causal_conv1d_prefill_reference, x, w, b)
    ref = functools.cache(lambda: jax.jit(lambda s: reference(s, rows))(state))

    # One input set: every call's output reads the carried state (the initial windows).
    sets = input_sets((x, w, b), 1)

    def make_step(cfg):
        return lambda i, s, sets: conv.causal_conv1d_prefill(
            *sets[0], s, rows, interpret=quick, **cfg
        )

    def check(call):
        (y, s), (y_ref, s_ref) = call(jnp.copy(state)), ref()
        return dict(err_y=rel_err(y, y_ref), err_state=rel_err(s, s_ref))

    def anchor(anchors):
        torch, triton = anchors[:2]
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv

        xt = torch.from_numpy(xn).cuda().bfloat16().view(1, T, channels)
        w_t, b_t = torch.from_numpy(wt).cuda().bfloat16(), torch.from_numpy(bs).cuda().bfloat16()
        cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
        h0 = torch.randn(batch, channels, W, device="cuda", dtype=torch.bfloat16)
        call = functools.partial(
            fla_conv,
            xt,
            w_t,
            b_t,
            initial_state=h0,
            output_final_state=True,
            activation="silu",
            backend="triton",
            cu_seqlens=cu,
        )
        call()
        us = bench_graph(torch, triton, call)
        # Accuracy of the anchor: without initial states (its window layout differs from ours).
        y0 = fla_conv(xt, w_t, b_t, activation="silu", backend="triton", cu_seqlens=cu)[0]
        y0_ref, _ = reference(state, rows_meta(batch, seqlen, hi=False))
        y0 = y0.float().cpu().numpy().reshape(T, channels)
        return dict(
            anchor="FLA 0.6.0 causal_conv1d (graph)",
            anchor_us=us,
            anchor_err_y_no_init=rel_err(y0, y0_ref),
        )

    # 40 calls per timed loop: chosen when each timing still paid the host's round trip (at 10
    # calls it added ~20 us to a ~120 us call on the H100); `device_seconds` now cancels it.
    return Case(
        "causal_conv1d_prefill", make_step, state, sets, check, 2 * T * channels * 2, 40, anchor
    )
