"""`max_model_len` defaults to the checkpoint's `max_position_embeddings`; a larger one is refused;
without memory sizing a defaulted length keeps the KV pool as small as before
(`runtime.core.model_len`)."""

from __future__ import annotations

import dataclasses

import pytest
from flax import nnx

import jmamba
from runtime.core.engine_args import EngineArgs
from runtime.core.model_len import DEFAULT_MAX_MODEL_LEN, default_num_blocks
from runtime.engine import Engine

NEMOTRON = jmamba.presets.tiny("nemotron_h")  # max_position_embeddings 2048, chunk size 16


def test_the_default_is_the_checkpoints_length():
    config = EngineArgs(max_num_seqs=8).for_model(NEMOTRON)
    assert config.max_model_len == NEMOTRON.max_position_embeddings == 2048
    # Pool: 8 requests of 512 tokens (256 blocks of 16) > one of 2048 (128 blocks), + NULL.
    assert config.num_blocks == 8 * 32 + 1
    assert EngineArgs.of_config(config).for_model(NEMOTRON) == config  # its args resolve to it


def test_a_long_context_default_gets_room_for_one_full_request_not_for_every_one():
    long = dataclasses.replace(NEMOTRON, max_position_embeddings=262144)
    config = EngineArgs(max_num_seqs=8).for_model(long)
    assert config.max_model_len == 262144
    assert config.num_blocks == 262144 // 16 + 1  # not 8 x 16384 + 1
    assert default_num_blocks(8, 262144, 16, defaulted=False) == 8 * 16384 + 1


def test_a_given_length_keeps_todays_pool():
    config = EngineArgs(max_num_seqs=8, max_model_len=1024).for_model(NEMOTRON)
    assert (config.max_model_len, config.num_blocks) == (1024, 8 * 64 + 1)


def test_a_length_above_the_checkpoints_is_refused_naming_both():
    message = "max_model_len=4096 is larger than the checkpoint's max_position_embeddings=2048"
    with pytest.raises(ValueError, match=message):
        EngineArgs(max_model_len=4096).for_model(NEMOTRON)


def test_a_config_without_a_checkpoint_gets_the_old_default():
    assert EngineArgs().resolved(16).max_model_len == DEFAULT_MAX_MODEL_LEN == 512


def test_an_explicit_num_blocks_is_checked_against_the_defaulted_length():
    with pytest.raises(ValueError, match="num_blocks=100 must be >= 129"):
        EngineArgs(num_blocks=100).for_model(NEMOTRON)


def test_an_engine_serves_up_to_the_checkpoints_length():
    model = jmamba.HybridLM(jmamba.presets.tiny("mamba2"), rngs=nnx.Rngs(0))
    engine = Engine(model, EngineArgs(max_num_seqs=2, prefix_caching="off"))
    assert engine.config.max_model_len == model.config.max_position_embeddings
    assert engine.runner.config.max_model_len == engine.config.max_model_len
