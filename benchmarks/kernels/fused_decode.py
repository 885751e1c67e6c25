"""The fused decode ops against the unfused paths they replace, on the GPU.

mamba2: `mamba2_decode` vs slicing xBC and dt out of in_proj's output, `causal_conv1d_update`,
splitting x / B / C, `ssd_state_update`. Bench model's Mamba2 layer: H 64, P 64, G 8, N 128, W 4.
gdn: `gdn_decode` vs slicing qkv, b and a, `causal_conv1d_update`, splitting q / k / v,
`gdn_state_update`. Qwen3-Next-shaped layer (the `gdn` bench's): HK 16, HV 32, K = V = 128, W 4.
Both: bf16 in_proj output and conv pool, fp32 recurrent state, one token per row (L = 1) updated in
place, B = 1, 16, 64, 256.

Each timing is one jitted, unrolled loop of many calls (`benchmarks.harness.timing.time_loop`),
rotating state slots so the state comes from DRAM. Roofline: the pools' bytes read + written
(recurrent state and conv windows) at the copy bandwidth measured at the start of the run
(`benchmarks.harness.timing.copy_bandwidth`, read + write). Also reported per batch: fused vs the
jnp reference and vs the unfused kernels, and the kernels each path launches (non-trivial
instructions of the compiled entry computation).

    python -m benchmarks.kernels fused_decode [mamba2,gdn]
    (writes $OUT/fused_decode.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Callable

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness.timing import copy_bandwidth, log, rel_err, time_loop  # noqa: E402
from pallas_kernels.conv import update as conv  # noqa: E402
from pallas_kernels.gdn import decode as gdnd  # noqa: E402
from pallas_kernels.gdn import reference as gdn_ref  # noqa: E402
from pallas_kernels.gdn import state_update as gdnu  # noqa: E402
from pallas_kernels.ssd import decode as m2d  # noqa: E402
from pallas_kernels.ssd import reference as ssd_ref  # noqa: E402
from pallas_kernels.ssd import state_update as ssu  # noqa: E402

BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
W = 4
OUT = os.environ.get("OUT", ".")

# Mamba2 layer.
H, P, G, N = 64, 64, 8, 128
D_INNER, CONV_DIM = H * P, H * P + 2 * G * N
# Gated DeltaNet layer.
HK, HV, DK, DV = 16, 32, 128, 128
KEY_DIM, VALUE_DIM = HK * DK, HV * DV
QKV_DIM = 2 * KEY_DIM + VALUE_DIM


def unfused_mamba2(
    zxbcdt, weight, bias, conv_state, ssm_state, a, d, dt_bias, read, write, **tuning
):
    """The Mamba2 mixer's decode path before the fusion."""
    lead = zxbcdt.shape[:2]
    xbc = zxbcdt[..., D_INNER : D_INNER + CONV_DIM]
    dt = zxbcdt[..., D_INNER + CONV_DIM :]
    xbc, conv_state = conv.causal_conv1d_update(xbc, weight, bias, conv_state, read, write)
    x, b, c = jnp.split(xbc, [D_INNER, D_INNER + G * N], axis=-1)
    y, ssm_state = ssu.ssd_state_update(
        x.reshape(*lead, H, P),
        dt,
        a,
        b.reshape(*lead, G, N),
        c.reshape(*lead, G, N),
        ssm_state,
        read,
        write,
        D=d,
        dt_bias=dt_bias,
        **tuning,
    )
    return y, conv_state, ssm_state


def fused_mamba2(
    zxbcdt,
    weight,
    bias,
    conv_state,
    ssm_state,
    a,
    d,
    dt_bias,
    read,
    write,
    reference: bool = False,
    **tuning,
):
    if reference:
        return ssd_ref.mamba2_decode_reference(
            zxbcdt, weight, bias, conv_state, ssm_state, a, read, write, D=d, dt_bias=dt_bias
        )
    return m2d.mamba2_decode(
        zxbcdt, weight, bias, conv_state, ssm_state, a, read, write, D=d, dt_bias=dt_bias, **tuning
    )


def unfused_gdn(mixed, weight, bias, conv_state, state, a_log, dt_bias, read, write, **tuning):
    """The Gated DeltaNet mixer's decode path before the fusion."""
    lead = mixed.shape[:2]
    qkv = mixed[..., :QKV_DIM]
    b = mixed[..., QKV_DIM + VALUE_DIM : QKV_DIM + VALUE_DIM + HV]
    a = mixed[..., QKV_DIM + VALUE_DIM + HV :]
    qkv, conv_state = conv.causal_conv1d_update(qkv, weight, bias, conv_state, read, write)
    q, k, v = jnp.split(qkv, [KEY_DIM, 2 * KEY_DIM], axis=-1)
    o, state = gdnu.gdn_state_update(
        q.reshape(*lead, HK, DK),
        k.reshape(*lead, HK, DK),
        v.reshape(*lead, HV, DV),
        a,
        b,
        a_log,
        dt_bias,
        state,
        read,
        write,
        block_v=tuning.get("block_p", 32),
        num_warps=tuning.get("num_warps", 4),
    )
    return o, conv_state, state


def fused_gdn(
    mixed,
    weight,
    bias,
    conv_state,
    state,
    a_log,
    dt_bias,
    read,
    write,
    reference: bool = False,
    **tuning,
):
    args = (mixed, weight, bias, conv_state, state, a_log, dt_bias, read, write)
    if reference:
        return gdn_ref.gdn_decode_reference(*args)
    return gdnd.gdn_decode(
        *args, block_v=tuning.get("block_p", 32), num_warps=tuning.get("num_warps", 4)
    )


@dataclasses.dataclass(frozen=True)
class Layer:
    """One op's bench: in_proj columns, conv channels, recurrent state per slot, per-head params."""

    name: str
    columns: int
    channels: int
    state_tail: tuple[int, ...]
    params: Callable[[Callable], tuple]  # f(*shape) -> the per-head arrays after the pools
    gate_columns: int  # the last in_proj columns (dt; a), shifted down so states decay slowly
    fused: Callable
    unfused: Callable
    # Tuning sweep: block_p is the head-dim tile (block_v for Gated DeltaNet).
    configs: tuple[dict, ...] = tuple(
        dict(block_p=bp, num_warps=w) for bp, w in ((16, 4), (32, 4), (64, 4), (64, 8))
    )


LAYERS = {
    "mamba2": Layer(
        "mamba2_decode",
        D_INNER + CONV_DIM + H,
        CONV_DIM,
        (H, P, N),
        lambda f: (-np.exp(f(H) * 0.5), f(H), f(H) * 0.5),
        H,
        fused_mamba2,
        unfused_mamba2,
    ),
    "gdn": Layer(
        "gdn_decode",
        QKV_DIM + VALUE_DIM + 2 * HV,
        QKV_DIM,
        (HV, DV, DK),
        lambda f: (f(HV) * 0.5, f(HV) * 0.5),
        HV,
        fused_gdn,
        unfused_gdn,
    ),
}


def count_kernels(fn, *args) -> int:
    """Instructions of the compiled entry computation that launch work (not parameters, tuples,
    bitcasts or constants): a proxy for the kernels one call launches."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    entry = text[text.index("ENTRY") :].split("\n}\n")[0]
    trivial = ("parameter(", "tuple(", "get-tuple-element(", "bitcast(", "constant(")
    ops = [line for line in entry.splitlines()[1:] if re.search(r"= \S+ \S+\(", line)]
    return sum(not any(t in line for t in trivial) for line in ops)


def layer_inputs(layer: Layer, rng, batch: int) -> tuple[tuple, tuple]:
    """((in_proj output [B, 1, columns], conv weight, conv bias), the per-head arrays) of one
    layer at `batch` rows, the gate columns shifted down so states decay slowly."""
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    mixed = f(batch, 1, layer.columns)
    mixed[..., -layer.gate_columns :] -= 2.0
    head = (
        jnp.asarray(mixed, BF),
        jnp.asarray(f(layer.channels, W) * 0.5, BF),
        jnp.asarray(f(layer.channels) * 0.1, BF),
    )
    return head, tuple(jnp.asarray(p, F32) for p in layer.params(f))


def bench_batch(layer: Layer, rng, batch: int, roof_tb_s: float) -> dict:
    """One batch size: errors, kernel counts, and the fused and unfused paths' best times and
    % of the `roof_tb_s` roofline."""
    head, params = layer_inputs(layer, rng, batch)
    slot_bytes = int(np.prod(layer.state_tail)) * 4 + layer.channels * (W - 1) * 2
    sets = max(2, -(-512 * 2**20 // (batch * slot_bytes)))  # >= 512 MiB of distinct slots
    slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
    key = jax.random.key(batch)

    def pools():
        k1, k2 = jax.random.split(key)
        return (
            jax.random.normal(k1, (sets * batch + 1, layer.channels, W - 1), BF),
            jax.random.normal(k2, (sets * batch + 1, *layer.state_tail), F32),
        )

    def call(fn, pool, sl, **kw):
        return fn(*head, *pool, *params, sl, sl[:, None], **kw)

    # Correctness on one call: fused vs the jnp reference and vs the unfused kernels.
    ref = call(layer.fused, pools(), slots[0], reference=True)
    got = call(layer.fused, pools(), slots[0])
    old = call(layer.unfused, pools(), slots[0])
    live = slots[0]
    errors = dict(
        err_vs_ref_y=rel_err(got[0], ref[0]),
        err_vs_ref_state=rel_err(got[2][live], ref[2][live]),
        err_vs_ref_conv=rel_err(got[1][live], ref[1][live]),
        err_vs_unfused_y=rel_err(got[0], old[0]),
    )
    del ref, got, old
    paths = (("fused", layer.fused), ("unfused", layer.unfused))
    sample = (*head, *pools(), *params, slots[0], slots[0][:, None])
    kernels = {name: count_kernels(fn, *sample) for name, fn in paths}
    del sample
    inner = 100 if batch <= 16 else 20
    times = {}
    for name, fn in paths:
        for cfg in layer.configs:

            def step(i, pool, _inputs, fn=fn, cfg=cfg):
                sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
                y, *pool = call(fn, pool, sl, **cfg)
                return y, tuple(pool)

            us = time_loop(step, pools(), inner=inner)
            log(f"{layer.name} B={batch} {name} {cfg}: {us:.1f} us")
            if name not in times or us < times[name][0]:
                times[name] = (us, cfg)
    nbytes = 2 * batch * slot_bytes
    ours, old_us = times["fused"][0], times["unfused"][0]
    return dict(
        op=layer.name,
        shape=f"B={batch} L=1 state {layer.state_tail} conv {layer.channels}x{W}",
        ours_us=ours,
        unfused_us=old_us,
        ratio=old_us / ours,
        pct_roofline=100.0 * nbytes / (ours * 1e-6) / (roof_tb_s * 1e12),
        unfused_pct_roofline=100.0 * nbytes / (old_us * 1e-6) / (roof_tb_s * 1e12),
        config=times["fused"][1],
        unfused_config=times["unfused"][1],
        kernels=kernels,
        **errors,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="?", default=",".join(LAYERS), help="comma-separated layers")
    names = parser.parse_args(argv).ops.split(",")
    unknown = sorted(set(names) - set(LAYERS))
    if unknown:
        parser.error(f"unknown layers {unknown}; known: {list(LAYERS)}")
    log("devices", jax.devices())
    roof_tb_s = copy_bandwidth()
    log(f"copy bandwidth (read + write) {roof_tb_s:.2f} TB/s")
    rng = np.random.default_rng(0)
    results = []
    for name in names:
        for batch in (1, 16, 64, 256):
            row = bench_batch(LAYERS[name], rng, batch, roof_tb_s)
            log("RESULT", json.dumps(row, default=str))
            results.append(row)
            with open(os.path.join(OUT, "fused_decode.json"), "w") as fh:
                json.dump(results, fh, indent=1, default=str)
    log(
        "\nop | shape | fused us | unfused us | unfused / fused | % roofline (fused, unfused) | "
        "kernels (fused, unfused) | err vs ref y"
    )
    for r in results:
        k = r["kernels"]
        log(
            f"{r['op']} | {r['shape']} | {r['ours_us']:.1f} | {r['unfused_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['pct_roofline']:.0f}%, {r['unfused_pct_roofline']:.0f}% | "
            f"{k['fused']}, {k['unfused']} | {r['err_vs_ref_y']:.1e}"
        )
