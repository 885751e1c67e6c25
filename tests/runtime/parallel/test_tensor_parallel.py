"""Tensor parallelism on the fake CPU devices: the same tokens and logits as one device.

Transformers fixtures run on one device and split over tp = 2, 3 or 4 (and dp = 2 x tp = 2):
greedy tokens equal, fp32 logits within 1e-5 at every step. The fixtures cover head counts that
divide and ones that need sharing: Qwen3-Next's 2 KV heads and 2 Gated DeltaNet key heads on 4
shards with its 4 experts and shared expert, Mamba2's 2 B/C groups on 4 shards (the gated norm's
group spans two shards), Falcon-H1's parallel hybrid layer, and (sampled, with logprobs) odd
dims with a vocabulary of 128 on 3 shards (the last one padded).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jmamba.checkpoints.weights import load_pretrained
from jmamba.config import ModelConfig
from jmamba.model import HybridLM
from jmamba.parallel.rules import Segment, split
from jmamba.sharding import param_rules, shard_config, tensor_parallel_sizes
from runtime.core.budgets import min_token_budget
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.distributed import make_mesh
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.device.placement import RandomShards, place_params
from runtime.engine import Engine
from runtime.outputs.request_output import RequestOutput
from tests.compiled import per_module
from tests.jmamba.fixture_runs import FIXTURES
from tests.tiers import quick_first

PROMPT_LENS = (1, 13, 37, 20, 5, 29)
MAX_TOKENS = 4
LOGITS_TOLERANCE = 1e-5


@per_module
def fixture_model(name: str) -> HybridLM:
    return load_pretrained(FIXTURES / name, host=True)


def engine_config(model: ModelConfig, dp: int, tp: int) -> EngineArgs:
    budget = max(32, min_token_budget(model.chunk_size, 4))
    return EngineArgs(
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        max_model_len=64,
        block_size=8,
        decode_row_buckets=(4,),
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(4,),
        validate_inputs=True,
        prefix_caching="off",
        data_parallel_size=dp,
        tensor_parallel_size=tp,
    )


def serve(
    name: str, dp: int, tp: int, params: list[SamplingParams]
) -> tuple[list[RequestOutput], list[np.ndarray]]:
    """Every prompt's output, with `params[i]`, and each step's logits of the engine on a
    dp x tp mesh."""
    model = fixture_model(name)
    engine = Engine(model, engine_config(model.config, dp, tp), keep_logits=True)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in PROMPT_LENS]
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    outputs, logits = {}, []
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
        logits.append(engine.last_result.logits)
    return [outputs[i] for i in ids], logits


def run(name: str, dp: int, tp: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens of every prompt and each step's logits."""
    outputs, logits = serve(name, dp, tp, [SamplingParams(max_tokens=MAX_TOKENS)] * 6)
    return [o.token_ids for o in outputs], logits


@per_module
def one_device(name: str) -> tuple[list[list[int]], list[np.ndarray]]:
    return run(name, 1, 1)


@pytest.mark.parametrize(
    ("name", "tp"),
    quick_first(
        [
            ("qwen3_next", 4),  # 2 KV heads, 2 GDN key heads on 4 shards; 4 experts
            ("mamba2", 4),  # 2 groups on 4 shards: a norm group over 2 shards
            ("falcon_h1", 2),  # attention beside Mamba2, one all-reduce
        ]
    ),
)
def test_tensor_parallel_tokens_and_logits_equal_one_device(name, tp):
    tokens, logits = run(name, 1, tp)
    expected_tokens, expected_logits = one_device(name)
    assert tokens == expected_tokens
    assert len(logits) == len(expected_logits)
    for step, (ours, theirs) in enumerate(zip(logits, expected_logits, strict=True)):
        delta = float(np.abs(ours - theirs).max())
        assert delta <= LOGITS_TOLERANCE, (step, delta)


def test_dp2_tp2_tokens_equal_one_device():
    """Two ranks of two shards each (test_tensor_parallel_schedules.py adds MoE, attention and
    an idle rank)."""
    tokens, _ = run("mamba2", 2, 2)
    assert tokens == one_device("mamba2")[0]


def test_sampling_and_logprobs_see_the_whole_vocabulary_across_shards():
    """Seeded temperature / top-k / top-p sampling with logprobs on 3 shards of a model with odd
    dims (its vocabulary of 128 in slices of 43, the last one padded): the tokens and
    log-probabilities (top 3) of one device."""
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0.9, top_k=40, top_p=0.9, seed=i, logprobs=3
        )
        for i in range(len(PROMPT_LENS))
    ]
    ours, _ = serve("mamba2_odd", 1, 3, params)
    theirs, _ = serve("mamba2_odd", 1, 1, params)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids
        for mine, one in zip(a.logprobs, b.logprobs, strict=True):
            assert mine.keys() == one.keys()
            assert all(abs(mine[t] - one[t]) <= LOGITS_TOLERANCE for t in mine)


def test_a_head_count_that_does_not_split_names_the_field_and_the_sizes_that_work():
    model = fixture_model("qwen3_next")  # 4 query heads, 2 KV heads, 2 + 4 GDN heads, 4 experts
    assert tensor_parallel_sizes(model.config) == [1, 2, 4]
    with pytest.raises(ValueError, match=r"attention.num_heads=4 .* values that work: 1, 2, 4"):
        shard_config(model.config, 3)
    config = engine_config(model.config, 1, 3)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 cannot split"):
        ModelRunner(model, resolve_config(model, config))


def test_each_device_holds_its_own_shard_of_each_parameter():
    """Placed from a whole model: device (r, t) holds shard t's slice, cut by the parameter's
    rule; made at random per shard: the same shapes, the whole model never built."""
    model = fixture_model("qwen3_next")
    mesh = make_mesh(2, 2)
    placed = place_params(model, mesh)
    rules = param_rules(model.config)
    whole = dict(nnx.to_flat_state(nnx.state(model)))
    flat = nnx.to_flat_state(jax.tree.unflatten(placed.treedef, placed.leaves))
    for path, leaf in flat:
        for shard in leaf.get_value().addressable_shards:
            t = shard.index[0].start
            expected = rules[path].take(np.asarray(whole[path].get_value()), t, 2)
            assert shard.data.shape == (1, *expected.shape), path
            np.testing.assert_array_equal(np.asarray(shard.data)[0], expected)
    abstract = nnx.eval_shape(lambda: HybridLM(model.config, rngs=nnx.Rngs(0)))
    made = RandomShards(seed=1, dtype="bfloat16")(abstract, mesh)
    assert [a.shape for a in made.leaves] == [a.shape for a in placed.leaves]
    assert made.num_params == placed.num_params == sum(v.size for v in jax.tree.leaves(whole))


def test_segments_split_share_and_pad():
    """Shard t takes its own units; a shared unit goes to the shards whose heads read it; the
    vocabulary's last slice is padded with zeros."""
    full = np.arange(2 * 3 + 4).reshape(1, -1)  # [heads: 2 x 3 | groups: 2 x 2]
    rule = split(1, Segment("h", 2, 3), Segment("g", 2, 2, replicable=True))
    assert rule.take(full, 1, 2).tolist() == [[3, 4, 5, 8, 9]]
    kv = split(0, Segment("kv", 2, 1, replicable=True))
    assert [kv.take(np.array([7, 9]), t, 4).tolist() for t in range(4)] == [[7], [7], [9], [9]]
    vocab = split(0, Segment("vocab_size", 5, padded=True))
    assert vocab.take(np.arange(1, 6), 2, 3).tolist() == [5, 0]
    with pytest.raises(ValueError, match="cannot split h=2"):
        rule.take(full, 0, 4)
