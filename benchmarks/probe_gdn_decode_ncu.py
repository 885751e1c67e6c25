"""The GDN decode state update, ours against FLA 0.6.0's, one kernel launch each, for Nsight
Compute (issue 29: at B >= 64 FLA's kernel moves the state faster than ours, and faster than a
Pallas kernel that only loads and stores it; the counters say where the difference is).

Qwen3-Next layer (HK 16, HV 32, K = V = 128), L = 1, fp32 V-first state, bf16 activations, B
rows reading slots 1..B and writing them in place (ours) or a fresh final state (FLA's API).
Each part runs its kernel `calls` times; profile the last launch:

    ncu --launch-skip 2 --launch-count 1 -k regex:gdn_state_update python3 \
        benchmarks/probe_gdn_decode_ncu.py ours 256 8 2      # B, block_v, num_warps
    ncu --launch-skip 2 --launch-count 1 -k regex:fused_recurrent python3 \
        benchmarks/probe_gdn_decode_ncu.py fla 256
"""

from __future__ import annotations

import sys

from benchmarks.bench_gdn_kernels import FLA_DECODE_OPTIONS, HK, HV, D

CALLS = 3


def decode_inputs(batch: int) -> tuple:
    """(q, k, v, a, b, A_log, dt_bias, state, read_slots): B rows of one lane, bf16 activations,
    an fp32 state pool of B + 1 slots, row b reading slot b + 1."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)

    def rnd(*shape, dtype=jnp.bfloat16):
        return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)

    q, k = rnd(batch, 1, HK, D), rnd(batch, 1, HK, D)
    v = rnd(batch, 1, HV, D)
    a, b = rnd(batch, 1, HV), rnd(batch, 1, HV)
    a_log, dt_bias = rnd(HV, dtype=jnp.float32), rnd(HV, dtype=jnp.float32)
    state = rnd(batch + 1, HV, D, D, dtype=jnp.float32) * 0.1
    read = jnp.arange(1, batch + 1, dtype=jnp.int32)
    return q, k, v, a, b, a_log, dt_bias, state, read


def ours(batch: int, block_v: int, num_warps: int) -> None:
    import functools

    import jax

    from pallas_kernels.gdn.state_update import gdn_state_update

    *ins, state, read = decode_inputs(batch)
    kernel = functools.partial(gdn_state_update, block_v=block_v, num_warps=num_warps)
    step = jax.jit(lambda s: kernel(*ins, s, read, read[:, None]), donate_argnums=0)
    for _ in range(CALLS):
        out, state = step(state)
    jax.block_until_ready(state)
    print(f"ours B={batch} block_v={block_v} warps={num_warps}: {float(out.sum()):.4f}")


def fla(batch: int) -> None:
    import torch
    import torch.nn.functional as F
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    dev = "cuda"
    q = torch.randn(batch, 1, HK, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(batch, 1, HK, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(batch, 1, HV, D, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(batch, 1, HV, device=dev))
    beta = torch.sigmoid(torch.randn(batch, 1, HV, device=dev))
    h0 = torch.randn(batch, HV, D, D, device=dev) * 0.1
    for _ in range(CALLS):
        o, _ = fused_recurrent_gated_delta_rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=h0,
            **FLA_DECODE_OPTIONS,
        )
    torch.cuda.synchronize()
    print(f"fla B={batch}: {float(o.float().sum()):.4f}")


if __name__ == "__main__":
    part, batch = sys.argv[1], int(sys.argv[2])
    if part == "ours":
        ours(batch, int(sys.argv[3]), int(sys.argv[4]))
    else:
        fla(batch)
