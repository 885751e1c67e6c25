"""Which part of `gdn_state_update` keeps it below FLA's memory throughput (issue 29)?

A copy of the kernel for one lane (L = 1, the decode step) whose features switch off one at a
time, each variant run for Nsight Compute as `probe_gdn_decode_ncu.py` runs the real one:

- `pid_slot`: the state row is b + 1 from the program id, no `read_slots` / `write_slots` load
  (FLA's addressing);
- `no_gates`: a and b are the decay and beta themselves (FLA takes g and beta precomputed; ours
  computes softplus, exp and sigmoid from a, b, A_log and dt_bias);
- `no_l2norm`: q and k used as given;
- `no_masks`: unmasked loads and stores (K = V = 128 fill the tile);
- `no_barrier`: no barrier between the state's load and its store;
- `qk_rows` (a change, not a removal): q and k loaded as [1, K] rows of the head axis, in the
  state tile's 2-D layout, instead of [K] vectors broadcast against it.

Not every variant computes the real update: they are for timing only.

    ncu ... -k regex:gdn_probe python3 benchmarks/probe_gdn_decode_ablation.py \
        256 8 1 pid_slot,no_gates      # B, block_v, num_warps, features off
    python3 benchmarks/probe_gdn_decode_ablation.py time   # the variants in bench_gdn_kernels' loop
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from benchmarks.bench_gdn_kernels import HK, HV, D, decode_loop_seconds
from benchmarks.probe_gdn_decode_ncu import CALLS, decode_inputs
from pallas_kernels._common import live_slot, safe_slot

FEATURES = ("pid_slot", "no_gates", "no_l2norm", "no_masks", "no_barrier", "qk_rows")


def _l2n(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x) + 1e-6)


def _kernel(
    read_ref, q_ref, k_ref, v_ref, a_ref, b_ref, alog_ref, dtb_ref, _, o_ref, s_ref, *, bv, off
):
    vt, hv, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hk, lane = hv // (HV // HK), jnp.int32(0)
    v_sl, k_sl = pl.ds(vt * bv, bv), pl.ds(0, D)
    num_slots = s_ref.shape[0]
    slot = b + 1 if "pid_slot" in off else safe_slot(read_ref[b], num_slots)
    live = True if "pid_slot" in off else live_slot(read_ref[b], num_slots)
    tile = s_ref.at[slot, hv, v_sl, k_sl]
    if "no_masks" in off:
        s = plgpu.load(tile)
    else:
        mask = (jnp.arange(bv) < D)[:, None] & (jnp.arange(D) < D)[None, :] & live
        s = plgpu.load(tile, mask=mask, other=0.0)
    if "no_barrier" not in off:
        plgpu.debug_barrier()
    head = pl.ds(hk, 1) if "qk_rows" in off else hk
    q = plgpu.load(q_ref.at[b, lane, head, k_sl]).astype(jnp.float32)
    k = plgpu.load(k_ref.at[b, lane, head, k_sl]).astype(jnp.float32)
    if "qk_rows" not in off:
        q, k = q[None, :], k[None, :]
    v = plgpu.load(v_ref.at[b, lane, hv, v_sl]).astype(jnp.float32)
    if "no_l2norm" not in off:
        q, k = _l2n(q), _l2n(k)
    q = q * D**-0.5
    a, beta = a_ref[b, lane, hv].astype(jnp.float32), b_ref[b, lane, hv].astype(jnp.float32)
    if "no_gates" in off:
        g = a
    else:
        neg_a = -jnp.exp(alog_ref[hv].astype(jnp.float32))
        g = neg_a * jax.nn.softplus(a + dtb_ref[hv].astype(jnp.float32))
        beta = jax.nn.sigmoid(beta)
    s = s * jnp.exp(g)
    delta = beta * (v - jnp.sum(s * k, axis=1))
    s = s + delta[:, None] * k
    o = jnp.sum(s * q, axis=1)
    plgpu.store(o_ref.at[b, lane, hv, v_sl], o.astype(o_ref.dtype))
    if "no_masks" in off:
        plgpu.store(tile, s)
    else:
        plgpu.store(tile, s, mask=mask)


def update(q, k, v, a, b, a_log, dt_bias, state, read, *, bv: int, warps: int, off: frozenset):
    batch = q.shape[0]
    return pl.pallas_call(
        functools.partial(_kernel, bv=bv, off=off),
        out_shape=(
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ),
        grid=(D // bv, HV, batch),
        input_output_aliases={8: 1},
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
        name="gdn_probe",
    )(read, q, k, v, a, b, a_log, dt_bias, state)


def main(batch: int, bv: int, warps: int, off: frozenset) -> None:
    *ins, state, read = decode_inputs(batch)
    call = functools.partial(update, bv=bv, warps=warps, off=off)
    step = jax.jit(lambda s: call(*ins, s, read), donate_argnums=0)
    for _ in range(CALLS):
        out, state = step(state)
    jax.block_until_ready(state)
    print(f"probe B={batch} bv={bv} warps={warps} off={sorted(off)}: {float(out.sum()):.3f}")


def _time(kernel, batch: int) -> float:
    """Microseconds per call in `bench_gdn_kernels.py`'s decode loop (call 5 of RESULTS.md's
    "Timing harness" section ran it before the host's round trip was cancelled)."""
    *ins, _, read = decode_inputs(batch)
    return decode_loop_seconds(lambda pool: kernel(*ins, pool, read)[1], batch) * 1e6


def time_variants() -> None:
    """The real kernel at its sweep's best knobs and the probe's variants, alternating, 3 rounds."""
    from pallas_kernels.gdn.state_update import gdn_state_update

    def real(bv: int, warps: int):
        def call(q, k, v, a, b, a_log, dt_bias, state, read):
            args = (q, k, v, a, b, a_log, dt_bias, state, read, read[:, None])
            return gdn_state_update(*args, block_v=bv, num_warps=warps)

        return call

    variants = {
        "real bv8 w2": real(8, 2),
        "real bv8 w1": real(8, 1),
        "probe bv8 w1": functools.partial(update, bv=8, warps=1, off=frozenset()),
        "probe bv8 w1 qk_rows": functools.partial(
            update, bv=8, warps=1, off=frozenset({"qk_rows"})
        ),
        "probe bv8 w1 qk_rows,no_barrier": functools.partial(
            update, bv=8, warps=1, off=frozenset({"qk_rows", "no_barrier"})
        ),
    }
    for batch in (64, 256):
        for round_ in range(3):
            for name, kernel in variants.items():
                print(f"B={batch} round {round_} {name}: {_time(kernel, batch):.1f} us", flush=True)


if __name__ == "__main__" and sys.argv[1] == "time":
    time_variants()
elif __name__ == "__main__":
    off = frozenset(f for f in (sys.argv[4].split(",") if len(sys.argv) > 4 else []) if f)
    assert off <= set(FEATURES), off
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), off)
