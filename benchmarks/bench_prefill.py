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
import dataclasses
import functools
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_mamba2_kernels import (  # noqa: E402
    RESULTS,
    bench_graph,
    copy_bandwidth,
    import_anchors,
    input_sets,
    log,
    record,
    rel_err,
    time_loop,
    unrolled,
)
from benchmarks.engine.trace import load_trace, profile_events  # noqa: E402
from pallas_kernels.conv import prefill as conv  # noqa: E402
from pallas_kernels.conv import reference as conv_ref  # noqa: E402
from pallas_kernels.gdn import chunk as gdn  # noqa: E402
from pallas_kernels.gdn import reference as gdn_ref  # noqa: E402
from pallas_kernels.rows import Rows  # noqa: E402
from pallas_kernels.ssd import chunk_scan as scan  # noqa: E402
from pallas_kernels.ssd import reference as scan_ref  # noqa: E402

BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
SHAPES = {"1x8192": (1, 8192), "8x2048": (8, 2048), "1x32768": (1, 32768)}
QUICK_SHAPES = {"2x40": (2, 40)}
CALLS = 8  # SSD and GDN calls per timed loop, each reading its own copy of the inputs

Inputs = list[tuple[jax.Array, ...]]  # input sets; call i of a timed loop reads set i % len
# A timed call: (i, state, inputs) -> (y, state)
Step = Callable[[int, jax.Array, Inputs], tuple[jax.Array, jax.Array]]
Call = Callable[[jax.Array], tuple[jax.Array, jax.Array]]  # one call: state -> (y, state)


@dataclasses.dataclass(frozen=True)
class Case:
    """One op at one shape, ready to run: `make_step(config)` builds a step over `state` and
    `inputs` (`input_sets`); `check(call)` is the error of one call against the reference;
    `nbytes` must move per call; `inner` calls per timed loop; `anchor(anchors)` times the anchor
    and returns its record fields."""

    op: str
    make_step: Callable[[dict], Step]
    state: jax.Array
    inputs: Inputs
    check: Callable[[Call], dict]
    nbytes: float
    inner: int
    anchor: Callable[[Any], dict]


def rows_meta(batch: int, seqlen: int, hi: bool = True) -> Rows:
    """`batch` rows of `seqlen` tokens from position 0 (has_initial_state `hi`), read slots
    1..R, write slots R+1..2R."""
    qsl = jnp.arange(batch + 1, dtype=I32) * seqlen
    rd = jnp.arange(1, batch + 1, dtype=I32)
    return Rows(qsl, jnp.zeros((batch,), I32), jnp.full((batch,), hi), rd, rd + batch)


def slot_pool(init: np.ndarray) -> jax.Array:
    """fp32 state pool [2R + 1, ...]: the initial states in slots 1..R, zeros elsewhere."""
    batch = init.shape[0]
    return jnp.zeros((2 * batch + 1,) + init.shape[1:], F32).at[1 : batch + 1].set(init)


def written_states(pool: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
    """The final states in slots R+1..2R of a `slot_pool` (R = pool rows // 2)."""
    return pool[pool.shape[0] // 2 + 1 :]


def anchor_fields(name: str, us: float, y, states, ref: Callable[[], tuple]) -> dict:
    """An anchor's record fields: its time, and the errors of its output `y` and final `states`
    (torch tensors) against our reference's output and the states it wrote."""
    y_ref, pool_ref = ref()
    return dict(
        anchor=name,
        anchor_us=us,
        anchor_err_y=rel_err(y.float().cpu().numpy().reshape(y_ref.shape), y_ref),
        anchor_err_state=rel_err(states.float().cpu().numpy(), written_states(pool_ref)),
    )


def pool_check(pool: jax.Array, ref: Callable[[], tuple]) -> Callable[[Call], dict]:
    """`Case.check` for an op writing final states into a `slot_pool`: errors of y and of them."""

    def check(call: Call) -> dict:
        (y, p), (y_ref, p_ref) = call(jnp.copy(pool)), ref()
        return dict(
            err_y=rel_err(y, y_ref), err_state=rel_err(written_states(p), written_states(p_ref))
        )

    return check


def kernel_breakdown(
    step: Step, state: jax.Array, inputs: Inputs, inner: int = 3
) -> dict[str, float]:
    """Microseconds per call of each GPU kernel of `step`, from one profiled jitted loop.

    A scalar of every output is carried, as in `time_loop`: a loop that kept only the state let
    XLA drop every kernel that writes only the output (the first breakdowns of issue 14 missed the
    SSD output and C B^T kernels and the conv kernel that way).
    """

    loop = jax.jit(functools.partial(unrolled, step, inner))
    carry = jax.block_until_ready(loop((state, jnp.zeros((), F32)), inputs))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(loop(carry, inputs))
        events = profile_events(load_trace(trace_dir))
    per, launches = collections.defaultdict(float), collections.Counter()
    for line, name, _, dur, _ in events:
        if "Stream" in line or "stream" in line:
            per[name[:60]] += dur / 1e3 / inner
            launches[name[:60]] += 1
    for name, count in launches.items():
        if count % inner:  # a kernel merged across calls would show here
            log(f"kernel {name}: {count} launches in {inner} calls")
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def sweep(case: Case, shape: str, configs: list[dict], bw: float) -> tuple[float, dict, Step]:
    """Time every config, record each; returns (us, config, step) of the fastest, or None."""
    best = None
    for cfg in configs:
        step = case.make_step(cfg)
        try:
            err = case.check(lambda state, step=step: step(0, state, case.inputs))
            us = time_loop(
                step, jnp.copy(case.state), inner=case.inner, reps=10, inputs=case.inputs
            )
        except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
            log(f"{case.op} {shape} {cfg} FAILED: {e!r}"[:600])
            continue
        pct = 100 * case.nbytes / (us * 1e-6) / (bw * 1e12)
        record(op=case.op, shape=shape, config=cfg, ours_us=us, pct_roofline=pct, **err)
        if best is None or us < best[0]:
            best = (us, cfg, step)
    return best


def run_case(
    case: Case, shape: str, configs: list[dict], bw: float, anchors, *, quick: bool, profile: bool
) -> dict | None:
    """Sweep (or, with `profile`, only build the first config), then on the GPU the fastest
    config's kernel breakdown and the anchor beside it. Returns the fastest config."""
    if profile:
        best = (float("nan"), configs[0], case.make_step(configs[0]))
    else:
        best = sweep(case, shape, configs, bw)
    if best is None or quick:
        return best and best[1]
    breakdown = kernel_breakdown(best[2], case.state, case.inputs)
    record(op=case.op, shape=shape, config=best[1], breakdown_us=breakdown)
    if anchors is not None and not profile:
        fields = case.anchor(anchors)
        record(
            op=case.op,
            shape=shape,
            ours_best_us=best[0],
            ratio=fields["anchor_us"] / best[0],
            **fields,
        )
    return best[1]


# ----------------------------------------------------------------------------- SSD chunk scan
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


# ----------------------------------------------------------------------------- Gated DeltaNet
HK, HV, DK = 16, 32, 128
GDN_CONFIGS = [
    dict(),
    dict(intra_num_warps=8),
    dict(intra_num_warps=2),
    dict(split_intra=True),
    dict(solve_block=32),
    dict(block_v=64),
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
        tuning = gdn.ChunkTuning(**cfg)
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


# ----------------------------------------------------------------------------- causal conv1d
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

    # 40 calls per timed loop: each timing also pays the loop's launch and sync (~0.2 ms on the
    # H100), which at 10 calls added ~20 us to a ~120 us call.
    return Case(
        "causal_conv1d_prefill", make_step, state, sets, check, 2 * T * channels * 2, 40, anchor
    )


CASES = {
    "ssd": (ssd_case, SSD_CONFIGS),
    "gdn": (gdn_case, GDN_CONFIGS),
    "conv": (conv_case, CONV_CONFIGS),
}


def fastest_configs(path: str) -> dict[tuple[str, str], list[dict]]:
    """(CASES key, shape) -> [the config with the lowest ours_us] in a results file."""
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
    ap.add_argument(
        "--profile",
        action="store_true",
        help="only the per-kernel breakdown of the first config (run with XLA_FLAGS="
        "--xla_gpu_enable_command_buffer= so XLA's CUDA graphs do not hide "
        "kernels from the profiler)",
    )
    args = ap.parse_args(argv)
    RESULTS.clear()  # one call's rows (the list is bench_mamba2_kernels')
    fastest = fastest_configs(args.configs) if args.configs else {}
    shapes = QUICK_SHAPES if args.quick else {s: SHAPES[s] for s in args.shapes.split(",")}
    bw = 1.0 if args.quick else copy_bandwidth()
    log(f"device {jax.devices()[0].device_kind}, copy bandwidth {bw:.2f} TB/s")
    record(device=jax.devices()[0].device_kind, copy_tb_s=bw)
    anchors = None if args.quick or args.no_anchors or args.profile else import_anchors()
    for op in args.ops.split(","):
        make_case, configs = CASES[op]
        configs = configs[:1] if args.quick else configs  # the full sweep on the first shape
        for i, (name, (batch, seqlen)) in enumerate(shapes.items()):
            if args.configs:
                configs = fastest.get((op, name), [])
                if not configs:
                    continue
            try:
                case = make_case(batch, seqlen, args.quick)
                best = run_case(
                    case, name, configs, bw, anchors, quick=args.quick, profile=args.profile
                )
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
