"""Mamba2 decode kernels, `ssd_state_update` and `causal_conv1d_update`: each checked against its
reference and timed beside its anchor. (The prefill kernels, SSD chunk scan and conv prefill, are
the `prefill` bench's.)

Anchors, in the same process: mamba_ssm 2.3.2.post1 Triton `selective_state_update` (imported
from its source tree without the package __init__, which needs the CUDA extension) and FLA
(fla-core 0.6.0) `causal_conv1d_update`. Shapes: 128 heads, head dim 64, state 128, 8 groups;
decode B = 1, 16, 64, 256; conv D = 8192, W = 4.

Ours: `benchmarks.harness.timing.time_loop` (unrolled loops of calls, the host's round trip
cancelled), rotating state slots so the state comes from DRAM, not L2. Anchors: do_bench medians
(L2 flushed between reps), replayed from a CUDA graph. `--only ssu,conv` (or $BENCH_ONLY) picks
sections; $OUT/results.json gets the rows.

    python -m benchmarks.kernels mamba2 [--only conv]                                  # GPU
"""

from __future__ import annotations

# ruff: noqa: B023  (loop closures are used within their own iteration)
import argparse
import functools
import json
import os
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness.timing import (  # noqa: E402
    RESULTS,
    copy_bandwidth,
    log,
    record,
    rel_err,
    time_loop,
)
from benchmarks.kernels.anchors import bench_graph, import_anchors  # noqa: E402
from pallas_kernels.conv import update as conv  # noqa: E402
from pallas_kernels.ssd import reference as ssd_ref  # noqa: E402
from pallas_kernels.ssd import state_update as ssu  # noqa: E402

H, P, N, G, W, D_CONV = 128, 64, 128, 8, 4, 8192
BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
OUT = os.environ.get("OUT", ".")
BW = {"tb_s": None}


def pct_roofline(nbytes: float, us: float) -> float:
    return 100.0 * nbytes / (us * 1e-6) / (BW["tb_s"] * 1e12)


# ----------------------------------------------------------------------------- decode: SSU


def ssu_inputs(rng, batch):
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(
        x=f(batch, 1, H, P),
        dt=f(batch, 1, H) - 2.0,
        A=-np.exp(f(H) * 0.5),
        B=f(batch, 1, G, N),
        C=f(batch, 1, G, N),
        D=f(H),
        z=f(batch, 1, H, P),
        dt_bias=f(H) * 0.5,
    )


def jax_ssu_args(d):
    cast = {"x": BF, "dt": BF, "B": BF, "C": BF, "z": BF}
    return {k: jnp.asarray(v, cast.get(k, F32)) for k, v in d.items()}


def bench_ssu(anchors, configs):
    torch, triton, sel_update, _ = anchors
    rng = np.random.default_rng(0)
    slot_bytes = H * P * N * 4
    for batch in (1, 16, 64, 256):
        d = ssu_inputs(rng, batch)
        a = jax_ssu_args(d)
        sets = max(2, -(-512 * 2**20 // (batch * slot_bytes)))  # >= 512 MiB of distinct slots
        slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
        pool = jax.random.normal(jax.random.key(1), (sets * batch + 1, H, P, N), F32)
        # Correctness: kernel vs reference on one call (fresh copies of the pool).
        kw = dict(D=a["D"], z=a["z"], dt_bias=a["dt_bias"])
        args = (a["x"], a["dt"], a["A"], a["B"], a["C"])
        y_ref, p_ref = ssd_ref.ssd_state_update_reference(
            *args, pool, slots[0], slots[0][:, None], **kw
        )
        y, p = ssu.ssd_state_update(*args, jnp.copy(pool), slots[0], slots[0][:, None], **kw)
        err_y, err_s = rel_err(y, y_ref), rel_err(p[slots[0]], p_ref[slots[0]])
        del p_ref, p
        best = None
        for cfg in configs:
            try:

                def step(i, pool, _inputs, cfg=cfg):
                    sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
                    return ssu.ssd_state_update(*args, pool, sl, sl[:, None], **kw, **cfg)

                us = time_loop(step, pool, inner=100 if batch <= 16 else 20)
                pool = jax.random.normal(jax.random.key(1), pool.shape, F32)  # donated above
                log(f"ssu B={batch} {cfg}: {us:.1f} us")
                if best is None or us < best[0]:
                    best = (us, cfg)
            except Exception as e:  # noqa: BLE001
                log(f"ssu B={batch} {cfg} FAILED: {e!r}"[:400])
        # Anchor: mamba_ssm selective_state_update on the same shapes (tie_hdim broadcasting).
        t = lambda k, dt=torch.bfloat16: torch.from_numpy(d[k]).cuda().to(dt)  # noqa: E731
        state = torch.randn(batch + 1, H, P, N, device="cuda", dtype=torch.float32)
        xx, zz = t("x")[:, 0], t("z")[:, 0]
        dtt = t("dt")[:, 0][:, :, None].expand(batch, H, P)
        aa = t("A", torch.float32)[:, None, None].expand(H, P, N)
        dd = t("D", torch.float32)[:, None].expand(H, P)
        bias = t("dt_bias", torch.float32)[:, None].expand(H, P)
        bb, cc = t("B")[:, 0], t("C")[:, 0]
        idx = torch.arange(1, batch + 1, device="cuda", dtype=torch.int32)
        state[1:] = torch.from_numpy(np.array(pool[1 : batch + 1])).cuda() if batch <= 64 else 0
        call = functools.partial(
            sel_update,
            state,
            xx,
            dtt,
            aa,
            bb,
            cc,
            D=dd,
            z=zz,
            dt_bias=bias,
            dt_softplus=True,
            state_batch_indices=idx,
        )
        y_anchor = call()
        anchor_us = bench_graph(torch, triton, call)
        cross = None
        if batch <= 64:  # same inputs and initial state: compare outputs with the anchor
            y1, _ = ssu.ssd_state_update(*args, jnp.copy(pool), slots[0], slots[0][:, None], **kw)
            cross = rel_err(np.asarray(y1[:, 0], np.float32), y_anchor.float().cpu().numpy())
        nbytes = 2 * batch * slot_bytes + batch * H * P * 2 * 3
        record(
            op="ssd_state_update",
            shape=f"B={batch} H{H} P{P} N{N} G{G}",
            ours_us=best[0],
            anchor="mamba_ssm selective_state_update",
            anchor_us=anchor_us,
            ratio=anchor_us / best[0],
            pct_roofline=pct_roofline(nbytes, best[0]),
            config=best[1],
            err_vs_ref_y=err_y,
            err_vs_ref_state=err_s,
            err_vs_anchor_y=cross,
        )
        del pool, state


# ----------------------------------------------------------------------------- conv1d update


def bench_conv_update(anchors, configs):
    torch, triton = anchors[0], anchors[1]
    from fla.modules.causal_conv1d import causal_conv1d_update as fla_update

    rng = np.random.default_rng(2)
    wt = rng.standard_normal((D_CONV, W), np.float32) * 0.5
    bs = rng.standard_normal(D_CONV, np.float32)
    w_j, b_j = jnp.asarray(wt, BF), jnp.asarray(bs, BF)
    w_t, b_t = torch.from_numpy(wt).cuda().bfloat16(), torch.from_numpy(bs).cuda().bfloat16()
    for batch in (1, 64, 256):
        xn = rng.standard_normal((batch, 1, D_CONV), np.float32)
        x = jnp.asarray(xn, BF)
        sets = max(2, -(-256 * 2**20 // (batch * D_CONV * (W - 1) * 2)))
        slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
        state = jnp.zeros((sets * batch + 1, D_CONV, W - 1), BF)

        def step(i, st, _inputs):
            sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
            return conv.causal_conv1d_update(x, w_j, b_j, st, sl, sl[:, None])

        us = time_loop(step, state, inner=100)
        cache = torch.zeros(batch, D_CONV, W, device="cuda", dtype=torch.bfloat16)
        xt = torch.from_numpy(xn).cuda().bfloat16()
        try:
            call = functools.partial(fla_update, xt, cache, weight=w_t, bias=b_t, activation="silu")
            anchor_us = bench_graph(torch, triton, call)
        except Exception as e:  # noqa: BLE001
            log(f"FLA causal_conv1d_update FAILED: {e!r}"[:400])
            anchor_us = float("nan")
        nbytes = batch * D_CONV * (2 * (W - 1) + 2) * 2
        record(
            op="causal_conv1d_update",
            shape=f"B={batch} D{D_CONV} W{W}",
            ours_us=us,
            anchor="FLA causal_conv1d_update",
            anchor_us=anchor_us,
            ratio=anchor_us / us,
            pct_roofline=pct_roofline(nbytes, us),
            config={},
        )


SECTIONS = {
    "ssu": (
        bench_ssu,
        [dict(block_p=bp, num_warps=w) for bp, w in ((16, 4), (32, 4), (32, 8), (64, 8))],
    ),
    "conv": (bench_conv_update, [{}]),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default=os.environ.get("BENCH_ONLY", ",".join(SECTIONS)),
        help=f"comma-separated sections, in order: {','.join(SECTIONS)} (default $BENCH_ONLY)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(filter(None, args.only.split(","))) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    return args


def print_table() -> None:
    log("\nop | shape | ours us | anchor us | ratio | % roofline | err vs ref | err vs anchor")
    for r in RESULTS:
        log(
            f"{r['op']} | {r['shape']} | {r['ours_us']:.1f} | {r['anchor_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['pct_roofline']:.0f}% | {r.get('err_vs_ref_y')} | "
            f"{r.get('err_vs_anchor_y')} | {r['config']}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log("devices", jax.devices())
    BW["tb_s"] = copy_bandwidth()
    log(f"copy bandwidth (read + write): {BW['tb_s']:.2f} TB/s")
    anchors = import_anchors()
    RESULTS.clear()
    for name in (o for o in args.only.split(",") if o):
        section, configs = SECTIONS[name]
        try:
            section(anchors, configs)
        except Exception:  # noqa: BLE001
            log(f"{section.__name__} FAILED\n{traceback.format_exc()}")
        with open(os.path.join(OUT, "results.json"), "w") as fh:
            json.dump({"bandwidth_tb_s": BW["tb_s"], "results": RESULTS}, fh, indent=1, default=str)
    print_table()
