"""What a decode state update's memory pattern costs, without its math (issue 29).

`gdn_state_update` moves the [HV, V, K] fp32 state of each row at 3.3 TB/s on the H200 where
FLA 0.6.0's `fused_recurrent_gated_delta_rule` moves 4.1 (B = 256, RESULTS.md). The two differ in
how they address the state, not in the bytes: ours reads each row's slot from `read_slots`,
updates the pool in place (aliased, with a barrier between the tile's loads and stores) and masks
dead slots; FLA reads `initial_state[b]` and writes a fresh `final_state[b]`. This probe times a
kernel that only loads a [block_v, K] tile, scales it and stores it, under each pattern:

    indirect_inplace   slot from read_slots, pool aliased, barrier, live-slot mask  (ours)
    indirect_nobarrier the same without the barrier
    direct_inplace     slot = b + 1 from the program id, pool aliased, barrier
    indirect_fresh     slot from read_slots, written to a fresh pool (not aliased)
    direct_fresh       FLA's pattern: row b of one array to row b of another

    PYTHONPATH=. python benchmarks/probe_state_traffic.py     (writes $OUT/state_traffic.json)
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, safe_slot

HV, V, K = 32, 128, 128  # the Qwen3-Next layer's value heads and head dims
PATTERNS = (
    "indirect_inplace",
    "indirect_nobarrier",
    "direct_inplace",
    "indirect_fresh",
    "direct_fresh",
)


def _kernel(slots_ref, src_ref, dst_ref, *, pattern: str, block_v: int):
    vt, hv, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    tile = (pl.ds(vt * block_v, block_v), pl.ds(0, K))
    if pattern.startswith("direct"):
        slot = b + 1
        s = src_ref[slot, hv, *tile]
    else:
        slot, num_slots = slots_ref[b], src_ref.shape[0]
        s = plgpu.load(
            src_ref.at[safe_slot(slot, num_slots), hv, *tile],
            mask=live_slot(slot, num_slots),
            other=0.0,
        )
    if pattern in ("indirect_inplace", "direct_inplace"):
        plgpu.debug_barrier()
    plgpu.store(dst_ref.at[slot, hv, *tile], s * 0.999)


def traffic(pool, slots, *, pattern: str, block_v: int, num_warps: int):
    """One call: every row's state tile loaded, scaled and stored under `pattern`."""
    batch = slots.shape[0]
    aliases = {1: 0} if pattern.endswith(("inplace", "nobarrier")) else {}
    return pl.pallas_call(
        functools.partial(_kernel, pattern=pattern, block_v=block_v),
        out_shape=jax.ShapeDtypeStruct(pool.shape, pool.dtype),
        grid=(V // block_v, HV, batch),
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        name=f"traffic_{pattern}",
    )(slots, pool)


def time_pattern(batch: int, **knobs) -> float:
    """Median microseconds per call, calls chained in one jitted loop over pools beyond L2."""
    pools = [jnp.zeros((batch + 1, HV, V, K), jnp.float32) for _ in range(4)]
    slots = jnp.arange(1, batch + 1, dtype=jnp.int32)
    inner = 8

    def loop(pools):
        for _ in range(inner):
            pools = [traffic(p, slots, **knobs) for p in pools]
        return pools

    f = jax.jit(loop, donate_argnums=0)
    pools = jax.block_until_ready(f(pools))
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        pools = jax.block_until_ready(f(pools))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (inner * len(pools)) * 1e6


def main() -> None:
    print("device", jax.devices()[0].device_kind, flush=True)
    rows = []
    for batch in (64, 256):
        state_bytes = 2 * batch * HV * V * K * 4
        for pattern in PATTERNS:
            for block_v, num_warps in ((8, 1), (8, 2), (32, 4)):
                us = time_pattern(batch, pattern=pattern, block_v=block_v, num_warps=num_warps)
                row = dict(batch=batch, pattern=pattern, block_v=block_v, num_warps=num_warps)
                row.update(us=us, tb_s=state_bytes / us / 1e6)
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "state_traffic.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print("\nB | pattern | best us | TB/s | block_v, warps")
    for batch in (64, 256):
        for pattern in PATTERNS:
            best = min(
                (r for r in rows if (r["batch"], r["pattern"]) == (batch, pattern)),
                key=lambda r: r["us"],
            )
            print(
                f"{batch} | {pattern} | {best['us']:.1f} | {best['tb_s']:.2f} | "
                f"{best['block_v']}, {best['num_warps']}"
            )


if __name__ == "__main__":
    main()
