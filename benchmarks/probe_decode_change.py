"""A change to the decode kernels, timed: a commit's copies (old) against the tree's (new).

Each batch times the fused and unfused decode paths of bench_fused_decode.py with the old
modules, then the new, then the old again (the host's speed drifts), and prints the ratio of the
old (mean of both) over the new. The old copies are not kept in the tree (benchmarks/_old/,
git-ignored; carry it to the device). Make them from commit C with

    mkdir -p benchmarks/_old && touch benchmarks/_old/__init__.py
    for f in gdn/state_update gdn/decode ssd/state_update ssd/decode conv/update; do
        git show C:pallas_kernels/$f.py > benchmarks/_old/$(echo $f | tr / _).py
    done

(for C = 8284ad2, before `conv_update_lanes` took its row, also pass `row=b`:
`sed -i 's/^        channel=/        row=b,\n        channel=/' benchmarks/_old/*_decode.py`).

Runs so far (RESULTS.md, 2026-11-27): the launch order (C = 8284ad2: rows first), and a change
that was measured and not kept (every lane input loaded before the barrier, against C =
c76bada).

    PYTHONPATH=. python benchmarks/probe_decode_change.py [mamba2,gdn]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
from benchmarks._old import (
    conv_update,
    gdn_decode,
    gdn_state_update,
    ssd_decode,
    ssd_state_update,
)

from benchmarks import bench_fused_decode as fd
from benchmarks.bench_mamba2_kernels import log

NEW = {"conv": fd.conv, "m2d": fd.m2d, "gdnd": fd.gdnd, "ssu": fd.ssu, "gdnu": fd.gdnu}
OLD = {
    "conv": conv_update,
    "m2d": ssd_decode,
    "gdnd": gdn_decode,
    "ssu": ssd_state_update,
    "gdnu": gdn_state_update,
}

# The two tiles that won most often in bench_fused_decode's sweep (RESULTS.md).
CONFIGS = (dict(block_p=32, num_warps=4), dict(block_p=16, num_warps=4))


def run(modules: dict, layer: fd.Layer, batch: int, roof_tb_s: float) -> dict:
    for name, module in modules.items():
        setattr(fd, name, module)
    return fd.bench_batch(layer, np.random.default_rng(batch), batch, roof_tb_s)


def main(argv: list[str]) -> None:
    names = argv[0].split(",") if argv else list(fd.LAYERS)
    roof_tb_s = fd.copy_bandwidth()
    rows = []
    for name in names:
        layer = dataclasses.replace(fd.LAYERS[name], configs=CONFIGS)
        for batch in (1, 16, 64, 256):
            old1, new, old2 = (run(m, layer, batch, roof_tb_s) for m in (OLD, NEW, OLD))
            row = dict(op=layer.name, batch=batch)
            for path, key in (("fused", "ours_us"), ("unfused", "unfused_us")):
                old_us = (old1[key] + old2[key]) / 2
                row[path] = dict(
                    old_us=[old1[key], old2[key]],
                    new_us=new[key],
                    old_over_new=old_us / new[key],
                    new_pct_roofline=new[
                        "pct_roofline" if path == "fused" else "unfused_pct_roofline"
                    ],
                )
            row["new_err_vs_ref_y"] = new["err_vs_ref_y"]
            row["new_err_vs_ref_state"] = new["err_vs_ref_state"]
            log("GRID", json.dumps(row))
            rows.append(row)
    with open(os.path.join(fd.OUT, "grid_order.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    log("\nop | B | path | old us (two runs) | new us | old / new | new % roofline")
    for r in rows:
        for path in ("fused", "unfused"):
            p = r[path]
            log(
                f"{r['op']} | {r['batch']} | {path} | {p['old_us'][0]:.1f}, {p['old_us'][1]:.1f} | "
                f"{p['new_us']:.1f} | {p['old_over_new']:.2f} | {p['new_pct_roofline']:.0f}%"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
