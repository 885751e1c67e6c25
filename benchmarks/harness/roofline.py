"""The memory roofline of a decode step: device memory bandwidth measured in the run, and the bytes
a step must move (weights it reads, recurrent states read and written, KV read)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from benchmarks.harness.timing import device_seconds
from jmamba import HybridLM
from runtime.engine import Engine


def measure_bandwidth(num_bytes: int | None = None, repeats: int = 20) -> float:
    """Bytes/s of device memory: one jitted bf16 negation over a donated `num_bytes` buffer
    (None: 1 GiB on the GPU, 16 MiB on the CPU, where the figure is only a smoke test; each
    pass reads and writes every byte in place), the host's round trip excluded
    (`benchmarks.harness.timing.device_seconds`, `repeats` timings). The pass negates: the earlier
    probes scaled by 1.0001, which is 1.0 in bf16, so XLA removed the pass (41 and 34 TB/s)."""
    donate = (0,) if jax.default_backend() == "gpu" else ()  # CPU cannot donate (it warns)
    scale = jax.jit(jax.numpy.negative, donate_argnums=donate)
    if num_bytes is None:
        num_bytes = 1 << (30 if jax.default_backend() == "gpu" else 24)
    x = jax.numpy.ones(num_bytes // 2, jax.numpy.bfloat16)
    return 2 * num_bytes / device_seconds(scale, x, reps=repeats, chain=10)


def weight_bytes(model: HybridLM, batch: int) -> int:
    """Weight bytes a decode step of `batch` tokens reads: every parameter but the embedding (a
    gather of B rows), MoE expert stacks scaled by the expected fraction of experts touched.
    The model may be shapes only (`nnx.eval_shape`)."""
    moe, total = model.config.moe, 0
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = leaf.get_value()
        if path == ("embed",):
            continue
        nbytes = value.size * np.dtype(value.dtype).itemsize  # a ShapeDtypeStruct has no nbytes
        if moe is not None and value.ndim == 3 and value.shape[0] == moe.num_experts:
            touched = 1 - (1 - moe.top_k / moe.num_experts) ** batch
            total += int(nbytes * touched)  # [E, ...] stack of routed experts
        else:
            total += nbytes
    return total


def step_bytes(model: HybridLM, engine: Engine, batch: int, context: int) -> dict[str, int]:
    """Bytes one decode step must move: weights, B states read + written, KV of B contexts."""
    state = kv = 0
    for cache in engine.runner.caches:
        if cache is None:
            continue
        for leaf in jax.tree.leaves(cache):
            per_entry = leaf.nbytes // leaf.shape[0]
            if type(cache).__name__ == "KVCache":  # [blocks, block_size, heads, dim]
                kv += per_entry // leaf.shape[1] * batch * (context + 1)
            else:  # [slots, ...]: read and write each live slot
                state += 2 * per_entry * batch
    return {"weights": weight_bytes(model, batch), "state": state, "kv": kv}
