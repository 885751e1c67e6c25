"""Prefill kernels on the GPU beside their anchors (issue 14): SSD chunk scan, Gated DeltaNet chunk,
causal conv1d, at 1x8192, 8x2048 and 1x32768 tokens.

For each op, shape and tuning config: accuracy (RMS error / RMS of the plain-jnp fp32 reference,
same bf16 inputs), our time (median of jitted loops of several calls, as `bench_mamba2_kernels`),
% of the memory roofline (bytes that must move / measured copy bandwidth), then for the best config
a per-kernel breakdown from a jax.profiler trace, and the anchor in the same process (CUDA graph,
`do_bench` with L2 flushed) with its own error against the same reference:
  ssd   mamba_ssm 2.3.2.post1 `mamba_chunk_scan_combined` (Triton, from .whl_mamba/src)
  gdn   FLA 0.6.0 `chunk_gated_delta_rule` (V-first state, l2norm in kernel)
  conv  FLA 0.6.0 `causal_conv1d` (Triton backend)
Shapes: Mamba2 128 heads, P 64, N 128, 8 groups, chunk 256; GDN 16 key / 32 value heads, d 128;
conv D 8192, W 4. Results as JSON lines (RESULT ...) and, with $OUT set, $OUT/bench_prefill.json.

    PYTHONPATH=. python benchmarks/bench_prefill.py --ops ssd,gdn,conv [--shapes 1x8192,8x2048]
        [--no-anchors] [--quick]        # --quick: tiny shapes, interpret mode on a CPU, no anchors
    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. python benchmarks/bench_prefill.py \
        --profile --configs benchmarks/configs/prefill_defaults.json --shapes 1x8192 --no-anchors
        # the per-kernel breakdown of each op's default config (the file lists them per shape)
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import tempfile
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_mamba2_kernels import (  # noqa: E402
    bench_graph,
    copy_bandwidth,
    import_anchors,
    rel_err,
    time_loop,
)
from benchmarks.profile_engine import profile_events  # noqa: E402
from pallas_kernels import causal_conv1d as conv  # noqa: E402
from pallas_kernels import causal_conv1d_reference as conv_ref  # noqa: E402
from pallas_kernels import gdn_chunk as gdn  # noqa: E402
from pallas_kernels import ssd_chunk_scan as scan  # noqa: E402
from pallas_kernels import ssd_chunk_scan_reference as scan_ref  # noqa: E402

BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
SHAPES = {"1x8192": (1, 8192), "8x2048": (8, 2048), "1x32768": (1, 32768)}
QUICK_SHAPES = {"2x40": (2, 40)}
RESULTS: list[dict] = []
PROFILE = {"on": False}


def log(*a) -> None:
    print(*a, flush=True)


def record(**row) -> None:
    RESULTS.append(row)
    log("RESULT", json.dumps(row, default=str))


def rows_meta(batch: int, seqlen: int, hi: bool = True):
    """query_start_loc, has_initial_state, read slots 1..R, write slots R+1..2R."""
    qsl = jnp.arange(batch + 1, dtype=I32) * seqlen
    rd = jnp.arange(1, batch + 1, dtype=I32)
    return qsl, jnp.full((batch,), hi), rd, rd + batch


def kernel_breakdown(step, pool, inner: int = 3) -> dict[str, float]:
    """Microseconds per call of each GPU kernel of `step`, from one profiled jitted loop.

    A scalar of every output is carried, as in `time_loop`: a loop that kept only the state let
    XLA drop every kernel that writes only the output (the first breakdowns of issue 14 missed the
    SSD output and C B^T kernels and the conv kernel that way).
    """

    def body(i, carry):
        pool, acc = carry
        y, pool = step(i, pool)
        return pool, acc + y.reshape(-1)[0].astype(F32)

    loop = jax.jit(lambda c: jax.lax.fori_loop(0, inner, body, c, unroll=True))
    carry = jax.block_until_ready(loop((pool, jnp.zeros((), F32))))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(loop(carry))
        events = profile_events(trace_dir)
    per = collections.defaultdict(float)
    for line, name, _, dur, _ in events:
        if "Stream" in line or "stream" in line:
            per[name[:60]] += dur / 1e3 / inner
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def sweep(op: str, shape: str, configs: list[dict], make_step, pool, inner: int, nbytes: float,
          bw: float, check) -> tuple[dict, object]:  # fmt: skip
    """Time every config, record each; returns the best config and its step. With PROFILE set
    (`--profile`), only builds the first config's step (its breakdown is the run's output)."""
    if PROFILE["on"]:
        return (float("nan"), configs[0], make_step(configs[0]))
    best = None
    for cfg in configs:
        step = make_step(cfg)
        try:
            err = check(step)
            us = time_loop(step, jnp.copy(pool), inner=inner, reps=10)
        except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
            log(f"{op} {shape} {cfg} FAILED: {e!r}"[:600])
            continue
        pct = 100 * nbytes / (us * 1e-6) / (bw * 1e12)
        record(op=op, shape=shape, config=cfg, ours_us=us, pct_roofline=pct, **err)
        if best is None or us < best[0]:
            best = (us, cfg, step)
    return best


# ----------------------------------------------------------------------------- SSD chunk scan
H, P, N, G = 128, 64, 128, 8
SSD_CONFIGS = [
    dict(algorithm="parallel", block_q=32, num_warps=4, num_stages=2),
    *(dict(algorithm="parallel", block_q=q, block_k=k, num_warps=w, num_stages=st)
      for q, k, w, st in ((64, 32, 4, 2), (64, 32, 4, 3), (64, 16, 4, 3), (128, 32, 8, 2),
                          (128, 64, 8, 3), (128, 32, 4, 3))),
    dict(algorithm="parallel", block_q=64, block_k=32, num_warps=4, num_stages=3, pass_stages=3),
    dict(algorithm="parallel", block_q=64, block_k=32, num_warps=4, num_stages=3, pass_stages=3,
         pass_block_n=32),
    dict(algorithm="sequential", seq_block_q=32),
]  # fmt: skip


def ssd_inputs(rng, batch: int, seqlen: int, heads=H, head_dim=P, groups=G, state=N) -> dict:
    T = batch * seqlen
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(x=f(T, heads, head_dim), dt=f(T, heads) - 2.0, A=-np.exp(f(heads) * 0.5),
                B=f(T, groups, state), C=f(T, groups, state), D=f(heads), dt_bias=f(heads) * 0.5,
                init=f(batch, heads, head_dim, state) * 0.1)  # fmt: skip


def bench_ssd(name, batch, seqlen, bw, anchors, quick, configs):
    rng = np.random.default_rng(1)
    d = ssd_inputs(rng, batch, seqlen, *((4, 16, 2, 16) if quick else ()))
    x, dt, bm, cm = (jnp.asarray(d[k], BF) for k in ("x", "dt", "B", "C"))
    A, Dk, bias = (jnp.asarray(d[k]) for k in ("A", "D", "dt_bias"))
    pool = jnp.zeros((2 * batch + 1,) + d["init"].shape[1:], F32).at[1 : batch + 1].set(d["init"])
    qsl, hi, rd, wr = rows_meta(batch, seqlen)
    meta = (qsl, jnp.zeros((batch,), I32), hi, rd, wr)
    ref_kw = dict(D=Dk, dt_bias=bias, chunk_size=32 if quick else 256)
    kw = ref_kw | dict(interpret=quick)
    reference = functools.partial(scan_ref.ssd_chunk_scan_reference, x, dt, A, bm, cm)
    ref = functools.cache(lambda: jax.jit(lambda p: reference(p, *meta, **ref_kw))(pool))

    def make_step(cfg):
        knobs = dict(cfg)
        algorithm = knobs.pop("algorithm")
        tuning = scan.ScanTuning(**knobs)
        return lambda i, p: scan.ssd_chunk_scan(x, dt, A, bm, cm, p, *meta, **kw,
                                                algorithm=algorithm, tuning=tuning)  # fmt: skip

    def check(step):
        (y, p), (y_ref, p_ref) = step(0, jnp.copy(pool)), ref()
        return dict(err_y=rel_err(y, y_ref), err_state=rel_err(p[batch + 1 :], p_ref[batch + 1 :]))

    T = batch * seqlen
    nbytes = T * (2 * x.shape[1] * x.shape[2] * 2 + 2 * bm.shape[1] * bm.shape[2] * 2 + 2 * H)
    nbytes += 2 * batch * int(np.prod(pool.shape[1:])) * 4
    best = sweep("ssd_chunk_scan", name, configs, make_step, pool, 8, nbytes, bw, check)
    if quick or best is None:
        return best and best[1]
    record(
        op="ssd_chunk_scan",
        shape=name,
        config=best[1],
        breakdown_us=kernel_breakdown(best[2], pool),
    )
    if anchors is None or PROFILE["on"]:
        return best[1]
    torch, triton, _, chunk_combined = anchors
    t = {k: torch.from_numpy(v).cuda() for k, v in d.items()}
    bf = {k: t[k].to(torch.bfloat16).view(batch, seqlen, *v.shape[1:])
          for k, v in d.items() if k in ("x", "dt", "B", "C")}  # fmt: skip
    call = functools.partial(
        chunk_combined, bf["x"], bf["dt"], t["A"], bf["B"], bf["C"], 256, D=t["D"],
        dt_bias=t["dt_bias"], initial_states=t["init"], dt_softplus=True, return_final_states=True,
    )  # fmt: skip
    y_a, s_a = call()
    us = bench_graph(torch, triton, call)
    y_ref, p_ref = ref()
    record(op="ssd_chunk_scan", shape=name, anchor="mamba_ssm mamba_chunk_scan_combined (graph)",
           anchor_us=us, ours_best_us=best[0], ratio=us / best[0],
           anchor_err_y=rel_err(y_a.float().cpu().numpy().reshape(y_ref.shape), y_ref),
           anchor_err_state=rel_err(s_a.float().cpu().numpy(), p_ref[batch + 1 :]))  # fmt: skip
    return best[1]


# ----------------------------------------------------------------------------- Gated DeltaNet
HK, HV, DK = 16, 32, 128
GDN_CONFIGS = [dict()]


def gdn_inputs(rng, batch: int, seqlen: int, hk=HK, hv=HV, dk=DK) -> dict:
    T = batch * seqlen
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(q=f(T, hk, dk), k=f(T, hk, dk), v=f(T, hv, dk),
                g=np.log(1 / (1 + np.exp(-f(T, hv)))), beta=1 / (1 + np.exp(-f(T, hv))),
                init=f(batch, hv, dk, dk) * 0.1)  # fmt: skip


def bench_gdn(name, batch, seqlen, bw, anchors, quick, configs):
    rng = np.random.default_rng(2)
    d = gdn_inputs(rng, batch, seqlen, *((2, 4, 16) if quick else ()))
    q, k, v = (jnp.asarray(d[n], BF) for n in ("q", "k", "v"))
    g, beta = jnp.asarray(d["g"]), jnp.asarray(d["beta"])
    pool = jnp.zeros((2 * batch + 1,) + d["init"].shape[1:], F32).at[1 : batch + 1].set(d["init"])
    qsl, hi, rd, wr = rows_meta(batch, seqlen)
    meta = (qsl, jnp.zeros((batch,), I32), hi, rd, wr)
    reference = functools.partial(gdn.gdn_chunk_reference, q, k, v, g, beta)
    ref = functools.cache(lambda: jax.jit(lambda p: reference(p, *meta))(pool))

    def make_step(cfg):
        return lambda i, p: gdn.gdn_chunk(q, k, v, g, beta, p, *meta, interpret=quick, **cfg)

    def check(step):
        (o, p), (o_ref, p_ref) = step(0, jnp.copy(pool)), ref()
        return dict(err_y=rel_err(o, o_ref), err_state=rel_err(p[batch + 1 :], p_ref[batch + 1 :]))

    T = batch * seqlen
    nbytes = T * ((2 * q.shape[1] + 2 * v.shape[1]) * q.shape[2] * 2 + 2 * v.shape[1] * 4)
    nbytes += 2 * batch * int(np.prod(pool.shape[1:])) * 4
    best = sweep("gdn_chunk", name, configs, make_step, pool, 8, nbytes, bw, check)
    if quick or best is None:
        return best and best[1]
    record(op="gdn_chunk", shape=name, config=best[1], breakdown_us=kernel_breakdown(best[2], pool))
    if anchors is None or PROFILE["on"]:
        return best[1]
    torch, triton = anchors[:2]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    t = {n: torch.from_numpy(a).cuda() for n, a in d.items()}
    bf = {n: t[n].to(torch.bfloat16)[None] for n in ("q", "k", "v")}
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
    call = functools.partial(
        chunk_gated_delta_rule, bf["q"], bf["k"], bf["v"], t["g"][None], t["beta"][None],
        initial_state=t["init"], output_final_state=True, use_qk_l2norm_in_kernel=True,
        state_v_first=True, cu_seqlens=cu if batch > 1 else None,
    )  # fmt: skip
    t0 = time.time()
    o_a, s_a = call()
    torch.cuda.synchronize()
    log(f"FLA chunk_gated_delta_rule first call {time.time() - t0:.1f} s")
    us = bench_graph(torch, triton, call)
    o_ref, p_ref = ref()
    record(op="gdn_chunk", shape=name, anchor="FLA 0.6.0 chunk_gated_delta_rule (graph)",
           anchor_us=us, ours_best_us=best[0], ratio=us / best[0],
           anchor_err_y=rel_err(o_a.float().cpu().numpy().reshape(o_ref.shape), o_ref),
           anchor_err_state=rel_err(s_a.float().cpu().numpy(), p_ref[batch + 1 :]))  # fmt: skip
    return best[1]


# ----------------------------------------------------------------------------- causal conv1d
D_CONV, W = 8192, 4
CONV_CONFIGS = [
    dict(block_t=64, block_d=128),
    dict(block_t=16, block_d=512),
    dict(block_t=32, block_d=256),
    dict(block_t=128, block_d=64, num_warps=4),
    dict(block_t=64, block_d=256, num_warps=8),
    *(dict(walk_tokens=wt, block_d=bd, unroll=u, num_warps=nw)
      for wt, bd, u, nw in ((128, 1024, 4, 4), (256, 1024, 8, 4), (128, 512, 4, 2),
                            (256, 2048, 4, 8), (512, 1024, 8, 4), (64, 1024, 4, 4))),
]  # fmt: skip


def bench_conv(name, batch, seqlen, bw, anchors, quick, configs):
    rng = np.random.default_rng(3)
    channels = 40 if quick else D_CONV
    T = batch * seqlen
    xn = rng.standard_normal((T, channels), np.float32)
    wt = rng.standard_normal((channels, W), np.float32) * 0.5
    bs = rng.standard_normal(channels, np.float32)
    x, w, b = jnp.asarray(xn, BF), jnp.asarray(wt, BF), jnp.asarray(bs, BF)
    init = rng.standard_normal((2 * batch + 1, channels, W - 1), np.float32)
    state = jnp.asarray(init, BF)
    meta = rows_meta(batch, seqlen)
    reference = functools.partial(conv_ref.causal_conv1d_prefill_reference, x, w, b)
    ref = functools.cache(lambda: jax.jit(lambda s: reference(s, *meta))(state))

    def make_step(cfg):
        return lambda i, s: conv.causal_conv1d_prefill(x, w, b, s, *meta, interpret=quick, **cfg)

    def check(step):
        (y, s), (y_ref, s_ref) = step(0, jnp.copy(state)), ref()
        return dict(err_y=rel_err(y, y_ref), err_state=rel_err(s, s_ref))

    nbytes = 2 * T * channels * 2
    best = sweep("causal_conv1d_prefill", name, configs, make_step, state, 10, nbytes, bw, check)
    if quick or best is None:
        return best and best[1]
    record(
        op="causal_conv1d_prefill",
        shape=name,
        config=best[1],
        breakdown_us=kernel_breakdown(best[2], state),
    )
    if anchors is None or PROFILE["on"]:
        return best[1]
    torch, triton = anchors[:2]
    from fla.modules.causal_conv1d import causal_conv1d as fla_conv

    xt = torch.from_numpy(xn).cuda().bfloat16().view(1, T, channels)
    w_t, b_t = torch.from_numpy(wt).cuda().bfloat16(), torch.from_numpy(bs).cuda().bfloat16()
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
    h0 = torch.randn(batch, channels, W, device="cuda", dtype=torch.bfloat16)
    call = functools.partial(fla_conv, xt, w_t, b_t, initial_state=h0, output_final_state=True,
                             activation="silu", backend="triton", cu_seqlens=cu)  # fmt: skip
    call()
    us = bench_graph(torch, triton, call)
    # Accuracy of the anchor: without initial states (its window layout differs from ours).
    y0 = fla_conv(xt, w_t, b_t, activation="silu", backend="triton", cu_seqlens=cu)[0]
    qsl, hi, rd, wr = meta
    y0_ref, _ = conv_ref.causal_conv1d_prefill_reference(x, w, b, state, qsl, ~hi, rd, wr)
    record(op="causal_conv1d_prefill", shape=name, anchor="FLA 0.6.0 causal_conv1d (graph)",
           anchor_us=us, ours_best_us=best[0], ratio=us / best[0],
           anchor_err_y_no_init=rel_err(y0.float().cpu().numpy().reshape(T, channels),
                                        y0_ref))  # fmt: skip
    return best[1]


BENCHES = {"ssd": (bench_ssd, SSD_CONFIGS), "gdn": (bench_gdn, GDN_CONFIGS),
           "conv": (bench_conv, CONV_CONFIGS)}  # fmt: skip


def fastest_configs(path: str) -> dict[tuple[str, str], list[dict]]:
    """(BENCHES key, shape) -> [the config with the lowest ours_us] in a results file."""
    keys = {"ssd_chunk_scan": "ssd", "gdn_chunk": "gdn", "causal_conv1d_prefill": "conv"}
    best: dict[tuple[str, str], tuple[float, dict]] = {}
    with open(path) as fh:
        for row in json.load(fh):
            if "ours_us" not in row:
                continue
            key = (keys[row["op"]], row["shape"])
            if key not in best or row["ours_us"] < best[key][0]:
                best[key] = (row["ours_us"], row["config"])
    return {key: [cfg] for key, (_, cfg) in best.items()}


def later_configs(configs: list[dict], best: dict | None) -> list[dict]:
    """After the first shape: its best config, plus the sequential SSD scan (the model default)."""
    keep = [c for c in configs if c.get("algorithm") == "sequential" and c != best]
    return ([best] if best is not None else configs[:1]) + keep


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="ssd,gdn,conv")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-anchors", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--configs",
        metavar="RESULTS_JSON",
        help="instead of the sweep lists: the fastest config of each op and shape in "
        "that file (a results file or a hand-written list of rows)",
    )
    ap.add_argument("--profile", action="store_true",
                    help="only the per-kernel breakdown of the first config (run with XLA_FLAGS="
                         "--xla_gpu_enable_command_buffer= so XLA's CUDA graphs do not hide "
                         "kernels from the profiler)")  # fmt: skip
    args = ap.parse_args(argv)
    PROFILE["on"] = args.profile
    fastest = fastest_configs(args.configs) if args.configs else {}
    shapes = QUICK_SHAPES if args.quick else {s: SHAPES[s] for s in args.shapes.split(",")}
    bw = 1.0 if args.quick else copy_bandwidth()
    log(f"device {jax.devices()[0].device_kind}, copy bandwidth {bw:.2f} TB/s")
    record(device=jax.devices()[0].device_kind, copy_tb_s=bw)
    anchors = None if args.quick or args.no_anchors or args.profile else import_anchors()
    for op in args.ops.split(","):
        bench, configs = BENCHES[op]
        configs = configs[:1] if args.quick else configs  # the full sweep on the first shape
        for i, (name, (batch, seqlen)) in enumerate(shapes.items()):
            if args.configs:
                configs = fastest.get((op, name), [])
                if not configs:
                    continue
            try:
                best = bench(name, batch, seqlen, bw, anchors, args.quick, configs)
            except Exception:  # noqa: BLE001  (one op failing must not lose the others)
                log(f"{op} {name} FAILED\n{traceback.format_exc()}"[-3000:])
                best = None
            if i == 0 and not args.configs:
                configs = later_configs(configs, best)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_prefill.json"), "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
    return RESULTS


if __name__ == "__main__":
    main()
