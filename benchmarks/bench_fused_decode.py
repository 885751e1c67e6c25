"""The fused Mamba2 decode op against the unfused path it replaces, on the GPU.

Unfused (the mixer before `mamba2_decode`): slice xBC and dt out of in_proj's output,
`causal_conv1d_update`, split x / B / C, `ssd_state_update`. Fused: `mamba2_decode` on in_proj's
output. Bench model's Mamba2 layer: H 64, P 64, G 8, N 128, d_conv 4; bf16 in_proj output and conv
pool, fp32 SSM state; one token per row (L = 1) at B = 1, 16, 64, 256, updated in place.

Each timing is one jitted, unrolled loop of many calls (`bench_mamba2_kernels.time_loop`), rotating
state slots so the state comes from DRAM. Roofline: the pools' bytes read + written (SSM state and
conv windows) at 2.9 TB/s (read + write, measured by bench_gdn_kernels on the H100; RESULTS.md).
Also checked on every batch: fused vs the jnp reference and vs the unfused kernels, and the number
of kernels each path launches (non-trivial instructions of the compiled entry computation).

    PYTHONPATH=. python benchmarks/bench_mamba2_decode.py    (writes $OUT/mamba2_decode.json)
"""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_mamba2_kernels import log, rel_err, time_loop  # noqa: E402
from pallas_kernels import causal_conv1d as conv  # noqa: E402
from pallas_kernels import mamba2_decode as m2d  # noqa: E402
from pallas_kernels import ssd_state_update as ssu  # noqa: E402

H, P, G, N, W = 64, 64, 8, 128, 4
D_INNER, CONV_DIM = H * P, H * P + 2 * G * N
BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
ROOF_TB_S = 2.9
CONFIGS = [dict(block_p=bp, num_warps=w) for bp, w in ((16, 4), (32, 4), (64, 4), (64, 8))]
OUT = os.environ.get("OUT", ".")


def unfused(zxbcdt, weight, bias, conv_state, ssm_state, a, read, write, *, D, dt_bias, **tuning):
    """The mixer's decode path before the fusion (same arguments and results as mamba2_decode)."""
    lead = zxbcdt.shape[:2]
    xbc = zxbcdt[..., D_INNER : D_INNER + CONV_DIM]
    dt = zxbcdt[..., D_INNER + CONV_DIM :]
    xbc, conv_state = conv.causal_conv1d_update(xbc, weight, bias, conv_state, read, write)
    x, b, c = jnp.split(xbc, [D_INNER, D_INNER + G * N], axis=-1)
    y, ssm_state = ssu.ssd_state_update(
        x.reshape(*lead, H, P), dt, a, b.reshape(*lead, G, N), c.reshape(*lead, G, N), ssm_state,
        read, write, D=D, dt_bias=dt_bias, **tuning,
    )  # fmt: skip
    return y, conv_state, ssm_state


PATHS = (("fused", m2d.mamba2_decode), ("unfused", unfused))


def count_kernels(fn, *args) -> int:
    """Instructions of the compiled entry computation that launch work (not parameters, tuples,
    bitcasts or constants): a proxy for the kernels one call launches."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    entry = text[text.index("ENTRY") :].split("\n}\n")[0]
    trivial = ("parameter(", "tuple(", "get-tuple-element(", "bitcast(", "constant(")
    ops = [line for line in entry.splitlines()[1:] if re.search(r"= \S+ \S+\(", line)]
    return sum(not any(t in line for t in trivial) for line in ops)


def inputs(rng, batch: int):
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    zx = f(batch, 1, D_INNER + CONV_DIM + H)
    zx[..., -H:] -= 2.0
    return dict(
        zxbcdt=jnp.asarray(zx, BF),
        weight=jnp.asarray(f(CONV_DIM, W) * 0.5, BF),
        bias=jnp.asarray(f(CONV_DIM) * 0.1, BF),
        a=jnp.asarray(-np.exp(f(H) * 0.5)),
        D=jnp.asarray(f(H)),
        dt_bias=jnp.asarray(f(H) * 0.5),
    )


def bench_batch(rng, batch: int) -> dict:
    d = inputs(rng, batch)
    slot_bytes = H * P * N * 4 + CONV_DIM * (W - 1) * 2
    sets = max(2, -(-512 * 2**20 // (batch * slot_bytes)))  # >= 512 MiB of distinct slots
    slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
    key = jax.random.key(batch)

    def pools():
        k1, k2 = jax.random.split(key)
        return (jax.random.normal(k1, (sets * batch + 1, CONV_DIM, W - 1), BF),
                jax.random.normal(k2, (sets * batch + 1, H, P, N), F32))  # fmt: skip

    head = (d["zxbcdt"], d["weight"], d["bias"])
    kw = dict(D=d["D"], dt_bias=d["dt_bias"])

    def call(fn, pool, sl, **tuning):
        return fn(*head, *pool, d["a"], sl, sl[:, None], **kw, **tuning)

    # Correctness on one call: fused vs the jnp reference and vs the unfused kernels.
    ref = call(m2d.mamba2_decode_reference, pools(), slots[0])
    got = call(m2d.mamba2_decode, pools(), slots[0])
    old = call(unfused, pools(), slots[0])
    live = slots[0]
    errors = dict(
        err_vs_ref_y=rel_err(got[0], ref[0]),
        err_vs_ref_state=rel_err(got[2][live], ref[2][live]),
        err_vs_ref_conv=rel_err(got[1][live], ref[1][live]),
        err_vs_unfused_y=rel_err(got[0], old[0]),
    )
    del ref, got, old
    sample = (*head, *pools(), d["a"], slots[0], slots[0][:, None])
    kernels = {name: count_kernels(lambda *a, fn=fn: fn(*a, **kw), *sample)
               for name, fn in PATHS}  # fmt: skip
    del sample
    inner = 100 if batch <= 16 else 20
    times = {}
    for name, fn in PATHS:
        for cfg in CONFIGS:

            def step(i, pool, fn=fn, cfg=cfg):
                sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
                y, *pool = call(fn, pool, sl, **cfg)
                return y, tuple(pool)

            us = time_loop(step, pools(), inner=inner)
            log(f"B={batch} {name} {cfg}: {us:.1f} us")
            if name not in times or us < times[name][0]:
                times[name] = (us, cfg)
    nbytes = 2 * batch * slot_bytes
    ours, old_us = times["fused"][0], times["unfused"][0]
    return dict(
        op="mamba2_decode",
        shape=f"B={batch} L=1 H{H} P{P} G{G} N{N} W{W}",
        ours_us=ours,
        unfused_us=old_us,
        ratio=old_us / ours,
        pct_roofline=100.0 * nbytes / (ours * 1e-6) / (ROOF_TB_S * 1e12),
        unfused_pct_roofline=100.0 * nbytes / (old_us * 1e-6) / (ROOF_TB_S * 1e12),
        config=times["fused"][1],
        unfused_config=times["unfused"][1],
        kernels=kernels,
        **errors,
    )


def main() -> None:
    log("devices", jax.devices())
    rng = np.random.default_rng(0)
    results = []
    for batch in (1, 16, 64, 256):
        row = bench_batch(rng, batch)
        log("RESULT", json.dumps(row, default=str))
        results.append(row)
        with open(os.path.join(OUT, "mamba2_decode.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    log("\nshape | fused us | unfused us | unfused / fused | % roofline (fused, unfused) | "
        "kernels (fused, unfused) | err vs ref y")  # fmt: skip
    for r in results:
        k = r["kernels"]
        log(f"{r['shape']} | {r['ours_us']:.1f} | {r['unfused_us']:.1f} | {r['ratio']:.2f} | "
            f"{r['pct_roofline']:.0f}%, {r['unfused_pct_roofline']:.0f}% | "
            f"{k['fused']}, {k['unfused']} | {r['err_vs_ref_y']:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
