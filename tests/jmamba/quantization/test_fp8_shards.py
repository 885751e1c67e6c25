"""FP8 dense projections stay e4m3 under tensor parallelism: each shard's kernel and scale slices
are read as stored (the shard model's shapes and dtypes), from a whole model on the host the
same values (`shard_values`), where the split keeps every scale block whole; a split that cuts
blocks (24-entry blocks of 32-channel halves) dequantizes those kernels with the plan's reason,
and expert stacks are read dequantized. The shards' values are the dequantized checkpoint's
(test_fp8_loading.py's `test_shards_are_read_dequantized`)."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from jmamba.checkpoints.shards import read_shards
from jmamba.checkpoints.source import param_path
from jmamba.checkpoints.weights import load_pretrained
from jmamba.loading import load_model_shapes
from jmamba.model import HybridLM
from jmamba.parallel.fp8_shards import scale_rule
from jmamba.parallel.rules import REPLICATED, Segment, split
from jmamba.sharding import shard_config, shard_values
from tests.jmamba.quantization.fp8_model import dequantized_shards
from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, write_pair

CASES = {
    "qwen3_next-16x16": ("qwen3_next", block_fp8()),
    "nemotron_h-channel": ("nemotron_h", compressed_tensors("channel")),
    "qwen3_next-24x24": ("qwen3_next", block_fp8(24, 24)),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("fp8_shards")
    return {case: write_pair(*CASES[case], root / case) for case in CASES}


def _shard_shapes(cfg) -> dict[tuple, tuple]:
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(model))
    return {param_path(p): v.get_value().shape for p, v in flat}


@pytest.mark.parametrize("case", ["qwen3_next-16x16", "nemotron_h-channel"])
def test_shards_hold_the_e4m3_kernels_and_their_scales(pairs, case):
    fp8, _ = pairs[case]
    whole = load_model_shapes(fp8)[0].config
    local = shard_config(whole, 2)
    assert local.quantization.layers == whole.quantization.layers != ()
    shards = dict(read_shards(fp8, 2))
    shapes = _shard_shapes(local)
    assert {p: v[0].shape for p, v in shards.items()} == shapes
    for layer, _ in local.quantization.layers:
        kernels, scales = shards[(*layer, "kernel")], shards[(*layer, "scale")]
        assert {k.dtype for k in kernels} == {np.dtype("float8_e4m3fn")}
        assert {s.dtype for s in scales} == {np.dtype(np.float32)}
    reasons = {why for _, why in local.quantization.dequantized}
    assert "an FP8 expert stack read shard by shard (its scales' split is not written)" in reasons


def test_a_split_that_cuts_scale_blocks_dequantizes_the_kernel(pairs):
    fp8, reference = pairs["qwen3_next-24x24"]
    whole = load_model_shapes(fp8)[0].config
    local = shard_config(whole, 2)
    assert whole.quantization.layers and local.quantization.layers == ()
    cut = "a split over 2 tensor-parallel shards cuts its scale blocks of 24 entries"
    assert cut in {why for _, why in local.quantization.dequantized}
    ours, theirs = dequantized_shards(fp8, 2), dict(read_shards(reference, 2))
    assert [p for p in ours if not all(map(np.array_equal, ours[p], theirs[p]))] == []


def test_a_whole_model_on_the_host_splits_to_the_same_shards(pairs):
    fp8, _ = pairs["qwen3_next-16x16"]
    model = load_pretrained(fp8)  # its expert stacks e4m3: dequantized for the shards
    assert model.config.quantization.experts
    flat = nnx.to_flat_state(nnx.state(model))
    host = dict(shard_values(model.config, 2, {param_path(p): v.get_value() for p, v in flat}))
    read = dict(read_shards(fp8, 2))
    assert host.keys() == read.keys()
    assert [p for p in host if not all(map(np.array_equal, host[p], read[p]))] == []


def test_scale_rules_follow_their_kernels_runs():
    heads = split(1, Segment("heads", 4, 64))
    channels = split(1, Segment("channels", 512))
    assert scale_rule(heads, 0, 2) is REPLICATED  # one scale along the split axis
    assert scale_rule(heads, 1, 2) is heads  # per channel
    assert scale_rule(heads, 32, 2) == split(1, Segment("heads", 4, 2))
    assert scale_rule(channels, 128, 2) == split(1, Segment("channels", 2, 2))  # 256 a shard
    assert scale_rule(channels, 128, 8) is None  # 64-channel runs cut the blocks
    assert scale_rule(split(1, Segment("kv", 1, 64, replicable=True)), 128, 2) is None
