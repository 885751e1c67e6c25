"""Engines with an FP8 KV cache (`kv_cache_dtype="fp8"`) and bf16 recurrent states
(`state_dtype="bfloat16"`) hold pools of the dtypes asked for and serve the tiny models with the
plain engine's greedy tokens and log-probabilities within a stated bound of the plain engine's.

e4m3 rounds every cached key and value by up to 2^-4 relative (`quantize_kv`), bf16 every stored
state by up to 2^-8 after each step. The bounds (`CASES`) are 2.5-3x the largest change measured
on these prompts, whose top two greedy log-probabilities lie at least 0.057 apart (nemotron_h;
qwen3_next 0.065), so the tokens agree. (On other prompts an FP8 cache moved qwen3_next's
log-probabilities by up to 0.2, and near-ties flip: these prompts were picked for their margins.)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from tests.runtime.conftest import base_config, make_engine, model_and_runner

PROMPTS = ([228, 126, 152, 242, 182], [218, 34, 145, 180, 211, 131, 94, 78, 106, 121])
PARAMS = SamplingParams(max_tokens=4, logprobs=2)
# (family, options, bound on |log-probability - the plain engine's|; measured beside it).
CASES = [
    ("nemotron_h", dict(kv_cache_dtype="fp8"), 0.04),  # 0.016
    ("nemotron_h", dict(state_dtype="bfloat16"), 0.004),  # 0.0013
    ("qwen3_next", dict(state_dtype="bfloat16"), 0.003),  # 0.0011
    ("qwen3_next", dict(kv_cache_dtype="fp8_e4m3", state_dtype="bfloat16"), 0.025),  # 0.0100
]


def served(engine: Engine) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Greedy tokens and their top log-probabilities of every prompt, served in one batch."""
    ids = [engine.add_request(list(prompt), PARAMS) for prompt in PROMPTS]
    done: dict = {}
    while engine.has_unfinished:
        done |= {o.request_id: o for o in engine.step()}
    return [(done[i].token_ids, done[i].logprobs) for i in ids]


def pool_dtypes(engine: Engine) -> set[np.dtype]:
    return {np.dtype(leaf.dtype) for leaf in jax.tree.leaves(engine.runner.caches)}


@pytest.mark.parametrize("family, options, bound", CASES)
def test_cache_dtypes_serve_the_plain_engines_tokens(family, options, bound):
    plain = served(make_engine(family))
    model, _ = model_and_runner(family)
    engine = Engine(model, dataclasses.replace(base_config(family), **options))
    dtypes = engine.config.cache_dtypes
    assert {dtypes.kv_dtype(model.dtype), dtypes.state_dtype} <= pool_dtypes(engine)
    for (tokens, logprobs), (plain_tokens, plain_logprobs) in zip(
        served(engine), plain, strict=True
    ):
        assert tokens == plain_tokens
        for row, plain_row in zip(logprobs, plain_logprobs, strict=True):
            for token in row.keys() & plain_row.keys():  # the sampled token at least
                assert abs(row[token] - plain_row[token]) <= bound, (token, row, plain_row)
