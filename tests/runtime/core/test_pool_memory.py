"""KV blocks sized from device memory (`gpu_memory_utilization`), against numbers computed by
hand, on fake CPU devices whose memory the test sets (the CPU reports none): what the parameters,
the largest step's activations and the state slots leave; the start-up log line of the pools."""

from __future__ import annotations

import logging

import pytest
from flax import nnx

import jmamba
from jmamba.cache_dtypes import CacheDtypes
from jmamba.checkpoints.weights import cast
from runtime.core.engine_args import EngineArgs
from runtime.core.pool_memory import PoolMemory, peak_activation_bytes
from runtime.device import footprint, memory
from runtime.engine import Engine

MIB = 1 << 20


def test_blocks_are_what_the_fraction_leaves_beside_parameters_activations_and_slots():
    pool = PoolMemory(
        device_bytes=10_000,
        param_bytes=3_000,
        block_bytes=100,
        slot_bytes=200,
        token_bytes=10,
        logits_row_bytes=60,
    )
    # 16 lanes x 10 bytes > 2 logits rows x 60 bytes: the layers' activations dominate.
    assert peak_activation_bytes(10, 60, step_tokens=16, logits_rows=2) == 160
    assert pool.activation_bytes(step_tokens=4, logits_rows=2) == 120  # here the logits do
    blocks = pool.num_blocks(0.9, num_slots=5, needed=10, step_tokens=16, logits_rows=2)
    assert blocks == (9_000 - 3_000 - 160 - 5 * 200) // 100
    with pytest.raises(ValueError, match="fewer than the 51 one request of max_model_len needs"):
        pool.num_blocks(0.9, num_slots=5, needed=51, step_tokens=16, logits_rows=2)


def test_a_model_without_attention_is_refused_when_its_slots_do_not_fit():
    pool = PoolMemory(
        10_000, 3_000, block_bytes=0, slot_bytes=200, token_bytes=0, logits_row_bytes=0
    )
    assert pool.num_blocks(0.9, num_slots=30, needed=2, step_tokens=1, logits_rows=1) == 2
    with pytest.raises(ValueError, match="31 state slots"):
        pool.num_blocks(0.9, num_slots=31, needed=2, step_tokens=1, logits_rows=1)


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
# Activations per token lane, fp32, on one of 2 shards: the residual stream and the normed input
# (2 x 64) beside the widest layer, the MoE layer: each of its top-2 choices' input and output
# (2 x 64) and expert up and relu^2 (2 x 32), beside the shared expert's 2 x 16 of 32 channels.
# (Attention: q 32 + k, v, out 64 = 96; Mamba2: in_proj 164 + y 64 = 228; MLP 2 x 64.)
TOKEN_BYTES = 4 * (2 * 64 + 2 * (2 * 64 + 2 * 32) + 2 * 16)
LOGITS_ROW_BYTES = 2 * 4 * 128  # fp32 logits and softmax over 128 of 256 vocabulary entries


def sized_from_memory(**options) -> EngineArgs:
    """Four requests of 64 tokens on two shards, blocks sized from half the device's memory
    (the hand-computed constants above); `options` the other fields."""
    return EngineArgs(
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
        block_size=8,
        prefix_caching="off",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        **options,
    )


def test_an_engine_on_two_shards_gets_the_hand_computed_pools(monkeypatch):
    monkeypatch.setattr(memory, "device_memory", lambda: 1 * MIB)
    model = jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    config = sized_from_memory()
    expected = PoolMemory(MIB, PARAMS * 4, BLOCK_BYTES, SLOT_BYTES, TOKEN_BYTES, LOGITS_ROW_BYTES)
    assert memory.pool_memory(model, config) == expected
    engine = Engine(model, config)
    slots = 1 + 4  # NULL + one per request
    # The largest step: the 32-token prefill bucket (> 4 decode rows); logits of 4 decode and 4
    # prefill rows (8 x 1 KiB < 32 x 2176 bytes: the layers dominate).
    activations = 32 * TOKEN_BYTES
    assert engine.config.num_slots == slots
    left = MIB // 2 - PARAMS * 4 - activations - slots * SLOT_BYTES
    assert engine.config.num_blocks == left // BLOCK_BYTES
    assert engine.runner.caches[2].k.shape[0] == engine.config.num_blocks
    line = engine.pool_memory.describe(engine.config.num_blocks, slots)
    assert f"{engine.config.num_blocks} KV blocks" in line and "5 state slots" in line


@pytest.mark.parametrize(
    "kv_cache_dtype, kv_bytes, state_dtype, state_bytes",
    [("auto", 4, "float32", 4), ("fp8", 1, "float32", 4), ("auto", 4, "bfloat16", 2)],
)
def test_cache_dtypes_size_the_pools(
    monkeypatch, kv_cache_dtype, kv_bytes, state_dtype, state_bytes
):
    """The same byte budget holds 4x the KV blocks of an fp32 model with an FP8 cache (2x those
    of a bf16 one), and bf16 recurrent states halve a slot's SSM state (its conv window stays)."""
    monkeypatch.setattr(memory, "device_memory", lambda: 1 * MIB)
    model = nnx.eval_shape(
        lambda: jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    )
    args = sized_from_memory(kv_cache_dtype=kv_cache_dtype, state_dtype=state_dtype)
    block = 2 * 8 * 1 * 16 * kv_bytes
    slot = CONV_DIM * 3 * 4 + 4 * 16 * 16 * state_bytes
    pool = memory.pool_memory(model, args)
    assert pool is not None and (pool.block_bytes, pool.slot_bytes) == (block, slot)
    left = MIB // 2 - PARAMS * 4 - 32 * TOKEN_BYTES - 5 * slot
    assert memory.resolve_config(model, args).num_blocks == left // block


def test_an_fp8_block_is_half_a_bf16_one():
    shapes = nnx.eval_shape(
        lambda: cast(
            jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0)), "bfloat16"
        )
    )
    bf16 = footprint.entry_bytes(shapes, 8)
    fp8 = footprint.entry_bytes(shapes, 8, CacheDtypes("fp8", "bfloat16"))
    assert fp8[0] * 2 == bf16[0] == 2 * 8 * 2 * 16 * 2 and fp8[1] < bf16[1]


def test_a_max_model_len_that_cannot_fit_is_refused(monkeypatch):
    monkeypatch.setattr(memory, "device_memory", lambda: 1 * MIB)
    model = nnx.eval_shape(
        lambda: jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    )
    # max_model_len defaults to the preset's 2048: 256 blocks of 8 tokens + NULL do not fit.
    config = EngineArgs(block_size=8, tensor_parallel_size=2, gpu_memory_utilization=0.5)
    with pytest.raises(ValueError, match="fewer than the 257 one request of max_model_len needs"):
        Engine(model, config)


def test_start_up_logs_the_pools_once(caplog):
    """One INFO line per engine: blocks and slots, the bytes of each, the total, the parameters."""
    caplog.set_level(logging.INFO, logger="runtime.device.footprint")
    model = jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    config = EngineArgs(
        max_num_seqs=4,
        max_model_len=64,
        block_size=8,
        num_blocks=40,
        prefix_caching="off",
        tensor_parallel_size=2,
    )
    Engine(model, config)
    [line] = [record.getMessage() for record in caplog.records]
    total = (40 * BLOCK_BYTES + 5 * SLOT_BYTES) / MIB
    assert line == (
        "pools of NemotronHForCausalLM (tensor-parallel shard 1 of 2), per device: 40 KV blocks "
        f"x {BLOCK_BYTES / MIB:.4f} MiB + 5 state slots x {SLOT_BYTES / MIB:.4f} MiB = "
        f"{total:.1f} MiB (kv_cache_dtype=auto, state_dtype=float32), beside "
        f"{PARAMS * 4 / MIB:.1f} MiB of parameters (device memory: not reported)"
    )


def test_memory_sizing_needs_a_device_that_reports_its_memory():
    model = nnx.eval_shape(lambda: jmamba.HybridLM(jmamba.presets.tiny("mamba2"), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="needs a device that reports its memory"):
        Engine(model, EngineArgs(gpu_memory_utilization=0.9))
