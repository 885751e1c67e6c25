"""The Mamba2 decode, fused (`mamba2_decode`) against the unfused kernels it replaced, one
launch each for Nsight Compute (issue 29: at B = 256 the fused op reaches 90% of the memory
roofline where the unfused `ssd_state_update` reaches 95%; the counters say where the 5% go).

The bench model's layer (`bench_fused_decode.py`: H 64, P 64, G 8, N 128, W 4), L = 1, bf16
in_proj output and conv pool, fp32 state, B rows reading and writing slots 1..B in place. Each
run calls its path `CALLS` times; profile the last launch of the kernel:

    ncu --launch-skip 2 --launch-count 1 -k regex:mamba2_decode_ssm python3 \
        benchmarks/probe_mamba2_decode_ncu.py fused 256 32 4      # B, block_p, num_warps
    ncu --launch-skip 2 --launch-count 1 -k regex:ssd_state_update python3 \
        benchmarks/probe_mamba2_decode_ncu.py unfused 256 32 4
"""

from __future__ import annotations

import sys

CALLS = 3


def build(path: str, batch: int, block_p: int, num_warps: int) -> tuple:
    """(step, conv pool, state pool): `step(conv, state) -> (y, conv, state)` jitted, the pools
    donated."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bench_fused_decode import BF, F32, LAYERS, W, layer_inputs

    layer = LAYERS["mamba2"]
    rng = np.random.default_rng(0)
    head, params = layer_inputs(layer, rng, batch)
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    conv = jnp.asarray(f(batch + 1, layer.channels, W - 1), BF)
    state = jnp.asarray(f(batch + 1, *layer.state_tail) * 0.1, F32)
    slots = jnp.arange(1, batch + 1, dtype=jnp.int32)
    fn = layer.fused if path == "fused" else layer.unfused
    tuning = dict(block_p=block_p, num_warps=num_warps)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(conv, state):
        y, conv, state = fn(*head, conv, state, *params, slots, slots[:, None], **tuning)
        return y, conv, state

    return step, conv, state


def main(path: str, batch: int, block_p: int, num_warps: int) -> None:
    import jax

    step, conv, state = build(path, batch, block_p, num_warps)
    for _ in range(CALLS):
        y, conv, state = step(conv, state)
    jax.block_until_ready(state)
    print(f"{path} B={batch} block_p={block_p} warps={num_warps}: {float(y.sum()):.4f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
