"""Tensor parallelism through the compiled kernels on real GPUs: each transformers fixture served
on one GPU and split over `--tp` GPUs (and, with `--dp`, over dp x tp), greedy tokens and (for dp =
1) every step's fp32 logits compared (tests/runtime/parallel/test_tensor_parallel.py does the same
on fake CPU devices with the reference kernels).

    PYTHONPATH=. python benchmarks/check_tensor_parallel.py --tp 2 --dp 1 \
        --families qwen3_next,mamba2,falcon_h1,nemotron_h,qwen3_5_moe,bamba,granite_h

Exits 1 if any tokens differ or a logit moves more than 1e-5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tests.runtime.parallel.test_tensor_parallel import LOGITS_TOLERANCE, run  # noqa: E402


def check(name: str, dp: int, tp: int) -> dict:
    start = time.perf_counter()
    tokens_one, logits_one = run(name, 1, 1)
    tokens, logits = run(name, dp, tp)
    delta = 0.0  # rows of several dp ranks do not line up with one device's: tokens only
    if dp == 1:
        delta = max(float(np.abs(a - b).max()) for a, b in zip(logits_one, logits, strict=True))
    ok = tokens == tokens_one and delta <= LOGITS_TOLERANCE
    return {
        "family": name,
        "dp": dp,
        "tp": tp,
        "tokens_equal": tokens == tokens_one,
        "max_logit_delta": delta,
        "ok": ok,
        "seconds": time.perf_counter() - start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--families", default="qwen3_next,mamba2,falcon_h1,nemotron_h")
    args = parser.parse_args()
    print(f"{len(jax.devices())} devices: {jax.devices()[0].device_kind}", flush=True)
    results = []
    for name in args.families.split(","):
        result = check(name, args.dp, args.tp)
        results.append(result)
        print(
            f"{'ok  ' if result['ok'] else 'FAIL'} {name:14s} dp={args.dp} tp={args.tp} tokens "
            f"{'equal' if result['tokens_equal'] else 'DIFFER'}, max|d logit| "
            f"{result['max_logit_delta']:.1e} ({result['seconds']:.0f} s)",
            flush=True,
        )
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "tensor_parallel.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
