"""KV blocks sized from device memory (`gpu_memory_utilization`), against numbers computed by
hand, on fake CPU devices whose memory the test sets (the CPU reports none)."""

from __future__ import annotations

import pytest
from flax import nnx

import jmamba
from runtime.core.config import EngineConfig
from runtime.core.pool_memory import PoolMemory
from runtime.device import memory
from runtime.engine import Engine

MIB = 1 << 20


def test_blocks_are_what_the_fraction_leaves_beside_parameters_and_slots():
    pool = PoolMemory(device_bytes=10_000, param_bytes=3_000, block_bytes=100, slot_bytes=200)
    assert pool.num_blocks(0.9, num_slots=5, needed=10) == (9_000 - 3_000 - 5 * 200) // 100
    with pytest.raises(ValueError, match="fewer than the 51 one request of max_model_len needs"):
        pool.num_blocks(0.9, num_slots=5, needed=51)


# tiny-nemotron_h on 2 shards, fp32, one device's share: block_size 8, layers
# [Mamba2, MLP, attention, MoE], hidden 64, vocabulary 256.
BLOCK_BYTES = 2 * 8 * 1 * 16 * 4  # K and V: block_size x 1 of 2 KV heads x head_dim 16
CONV_DIM = 4 * 16 + 2 * 1 * 16  # 4 of 8 SSM heads x head_dim 16 + B and C of 1 of 2 groups
SLOT_BYTES = (CONV_DIM * 3 + 4 * 16 * 16) * 4  # conv window (d_conv - 1) + SSM state
PARAMS = (
    2 * 128 * 64  # embedding and LM head: 128 of 256 rows / columns
    + 64  # final norm
    + 64
    + 64 * (2 * 64 + 2 * 16 + 4)
    + CONV_DIM * 5
    + 3 * 4
    + 64
    + 64 * 64  # Mamba2 layer
    + 64
    + 2 * 64 * 64  # MLP layer: 64 of 128 channels, up and down
    + 64
    + 64 * 32
    + 2 * 64 * 16
    + 32 * 64  # attention layer: 2 of 4 heads, 1 of 2 KV heads
    + 64
    + 64 * 4
    + 4
    + 2 * 2 * 64 * 32
    + 2 * 64 * 16  # MoE: router, 2 of 4 experts, shared
)  # norms whole; Mamba2: in_proj [z x B C dt], conv taps + bias, A D dt_bias, norm, out_proj


def test_an_engine_on_two_shards_gets_the_hand_computed_pools(monkeypatch):
    monkeypatch.setattr(memory, "device_memory", lambda: 1 * MIB)
    model = jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    config = EngineConfig(
        max_num_seqs=4,
        max_model_len=64,
        block_size=8,
        prefix_caching="off",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
    )
    assert memory.pool_memory(model, config) == PoolMemory(MIB, PARAMS * 4, BLOCK_BYTES, SLOT_BYTES)
    engine = Engine(model, config)
    slots = 1 + 4  # NULL + one per request
    assert engine.config.num_slots == slots
    assert engine.config.num_blocks == (MIB // 2 - PARAMS * 4 - slots * SLOT_BYTES) // BLOCK_BYTES
    assert engine.runner.caches[2].k.shape[0] == engine.config.num_blocks
    line = engine.pool_memory.describe(engine.config.num_blocks, slots)
    assert f"{engine.config.num_blocks} KV blocks" in line and "5 state slots" in line


def test_a_max_model_len_that_cannot_fit_is_refused(monkeypatch):
    monkeypatch.setattr(memory, "device_memory", lambda: 1 * MIB)
    model = nnx.eval_shape(
        lambda: jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    )
    config = EngineConfig(
        max_model_len=8192, block_size=8, tensor_parallel_size=2, gpu_memory_utilization=0.5
    )
    with pytest.raises(ValueError, match="fewer than the 1025 one request of max_model_len needs"):
        Engine(model, config)


def test_memory_sizing_needs_a_device_that_reports_its_memory():
    model = nnx.eval_shape(lambda: jmamba.HybridLM(jmamba.presets.tiny("mamba2"), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="needs a device that reports its memory"):
        Engine(model, EngineConfig(gpu_memory_utilization=0.9))
