"""Timing the model runner below the engine: the compiled step with numpy or device inputs,
pipelined, dispatch alone, the uploads, and the compiled call alone with stable or fresh output
buffers (jax and numpy are passed in by the profiler's child process)."""

from __future__ import annotations

import time


def device_inputs(runner, bucket, batch_in, jax):
    """The step's packed inputs, already on the device."""
    return runner.device_inputs(bucket, [batch_in])


def time_runner(runner, bucket, batch_in, steps, np, jax) -> dict:
    """ms per call: numpy inputs + fetch; device inputs + fetch; pipelined; dispatch only."""
    res = {}
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.run(bucket, [batch_in])
    res["runner_numpy_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    dev = device_inputs(runner, bucket, batch_in, jax)
    t0 = time.perf_counter()
    for _ in range(steps):
        np.asarray(runner.dispatch(bucket, [batch_in], dev).tokens)
    res["runner_device_in_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        step = runner.dispatch(bucket, [batch_in], dev)
    np.asarray(step.tokens)
    res["pipelined_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    dispatch = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        step = runner.dispatch(bucket, [batch_in], dev)
        dispatch += time.perf_counter() - t0
        np.asarray(step.tokens)
    res["dispatch_ms"] = 1e3 * dispatch / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dev_np = jax.device_put((batch_in.inputs, batch_in.sampling))
    jax.block_until_ready(dev_np)
    res["device_put_tree_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dev_np = device_inputs(runner, bucket, batch_in, jax)
    jax.block_until_ready(dev_np)
    res["device_put_packed_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    key = runner._variant(bucket, [batch_in], drafts=True)
    res.update(time_step_call(runner, key, dev, steps, jax))
    return res


def time_step_call(runner, key, packed, steps: int, jax) -> dict:
    """ms until the compiled step alone returns (no upload, download or fetch), in one process:
    `stable`, with the variant's own output buffers, so every buffer keeps its address; `fresh`,
    with new output buffers each call (the runner before runtime/device/step_buffers.py), so XLA
    records the step's CUDA graph again before each launch. Each in a block of its own (the first
    call of a block, which re-records after the other, is left out)."""
    import jax.numpy as jnp

    compiled, slot = runner._compiled[key], runner.buffers.upload(key, packed)

    def call(outputs):
        t0 = time.perf_counter()
        runner.caches, outputs, runner.buffers.carried = compiled(  # the carried array donated
            runner._param_leaves, runner.caches, slot, outputs, runner.buffers.carried
        )
        elapsed = time.perf_counter() - t0
        jax.block_until_ready(outputs)
        return elapsed, outputs

    res, outputs, alive = {}, runner.buffers.outputs(key), []
    for name in ("stable", "fresh"):
        total = 0.0
        for i in range(steps + 1):
            if name == "fresh":  # new buffers while the last ones are alive: a new address
                outputs = jax.block_until_ready(jax.tree.map(jnp.zeros_like, outputs))
            elapsed, outputs = call(outputs)
            alive = [outputs, *alive[:1]]
            total += elapsed if i else 0.0
        res[f"call_{name}_ms"] = 1e3 * total / steps
    runner.buffers.keep(key, outputs, runner.buffers.carried)
    return res
