"""Prefill kernels on the GPU beside their anchors (issue 14): SSD chunk scan, Gated DeltaNet chunk,
causal conv1d, at 1x8192, 8x2048 and 1x32768 tokens.

For each op, shape and tuning config: accuracy (RMS error / RMS of the plain-jnp fp32 reference,
same bf16 inputs), our time (median of jitted loops of several calls, `benchmarks.harness.timing`),
% of the memory roofline (bytes that must move / measured copy bandwidth), then for the best config
a per-kernel breakdown from a jax.profiler trace, and the anchor in the same process (CUDA graph,
`do_bench` with L2 flushed) with its own error against the same reference:
  ssd   mamba_ssm 2.3.2.post1 `mamba_chunk_scan_combined` (Triton, from .whl_mamba/src)
  gdn   FLA 0.6.0 `chunk_gated_delta_rule` (V-first state, l2norm in kernel)
  conv  FLA 0.6.0 `causal_conv1d` (Triton backend)
Shapes: Mamba2 128 heads, P 64, N 128, 8 groups, chunk 256; GDN 16 key / 32 value heads, d 128;
conv D 8192, W 4. Results as JSON lines (RESULT ...) and, with $OUT set, $OUT/bench_prefill.json.

    python -m benchmarks.kernels prefill --ops ssd,gdn,conv [--shapes 1x8192,8x2048]
        [--no-anchors] [--quick]        # --quick: tiny shapes, interpret mode on a CPU, no anchors
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python -m benchmarks.kernels prefill \
        --profile --configs benchmarks/configs/prefill_defaults.json --shapes 1x8192 --no-anchors
        # the per-kernel breakdown of each op's default config (the file lists them per shape)
"""

from __future__ import annotations

import argparse
import json
import os
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

from benchmarks.harness.timing import RESULTS, copy_bandwidth, log, record  # noqa: E402
from benchmarks.kernels.anchors import import_anchors  # noqa: E402
from benchmarks.kernels.prefill_ops.conv import CONV_CONFIGS, conv_case  # noqa: E402
from benchmarks.kernels.prefill_ops.gdn import GDN_CONFIGS, gdn_case  # noqa: E402
from benchmarks.kernels.prefill_ops.ssd import SSD_CONFIGS, ssd_case  # noqa: E402
from benchmarks.kernels.prefill_ops.timing import run_case  # noqa: E402

SHAPES = {"1x8192": (1, 8192), "8x2048": (8, 2048), "1x32768": (1, 32768)}
QUICK_SHAPES = {"2x40": (2, 40)}

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
    RESULTS.clear()  # one call's rows (the list is benchmarks.harness.timing's)
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
