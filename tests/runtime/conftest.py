"""Shared engines for the runtime tests: one model and one compiled runner per family per session.

Every engine built from `make_engine` shares its family's runner (fixed bucket tables, so at most
three step variants compile per family) and therefore its caches: each test starts on pools full of
an earlier test's states, which docs/architecture.md section 5 invariant 4 must make harmless.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

import jmamba
from jmamba.step.pytree import DecodeRows, PrefillRows, StepInputs
from runtime.core.budgets import min_token_budget
from runtime.core.engine_args import EngineArgs
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.tiers import quick_first

FAMILIES = ("mamba2", "nemotron_h", "qwen3_next")
MAX_MODEL_LEN = 64
BLOCK_SIZE = 8
MAX_NUM_SEQS = 4
# Decode steps a program runs, as the random schedules draw them (`EngineArgs.decode_steps`): 3
# puts stops, lengths, aborts and preemptions inside a program, and compiles one more variant.
DECODE_STEPS = (1, 3)


def base_config(family: str) -> EngineArgs:
    """Small pools (13 KV blocks: 12 usable, 8 per full-length request) to force preemption."""
    budget = max(32, min_token_budget(jmamba.presets.tiny(family).chunk_size, MAX_NUM_SEQS))
    return EngineArgs(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        num_blocks=13,
        num_slots=6,
        decode_row_buckets=(4,),
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(4,),
        validate_inputs=True,
        prefix_caching="off",  # test_prefix_caching.py has runners of its own
    )


@per_module
def model_and_runner(family: str) -> tuple[nnx.Module, ModelRunner]:
    """The family's model and shared runner. Every module builds them anew (tests/compiled.py);
    JAX's persistent cache, shared by the run's workers, keeps XLA's output. No step store:
    XLA:CPU programs loaded by another process failed at dispatch now and then
    (`compile_cache.step_store`)."""
    model = jmamba.HybridLM(jmamba.presets.tiny(family), rngs=nnx.Rngs(0))
    config = resolve_config(model, base_config(family))
    return model, ModelRunner(model, config, keep_logits=True)


@per_module
def model_with_eos(family: str, eos_token_ids: tuple[int, ...]) -> nnx.Module:
    """The family's model with other EOS ids, as shapes only: an engine on the shared runner
    reads nothing but its config."""
    config = dataclasses.replace(jmamba.presets.tiny(family), eos_token_ids=eos_token_ids)
    return nnx.eval_shape(lambda: jmamba.HybridLM(config, rngs=nnx.Rngs(0)))


def make_engine(family: str, eos_token_ids: tuple[int, ...] | None = None, **options) -> Engine:
    """A fresh engine (fresh scheduler and pools) on the family's shared runner and caches;
    `eos_token_ids` replaces the model's EOS ids, `options` the EngineArgs fields."""
    model, runner = model_and_runner(family)
    if eos_token_ids is not None:
        model = model_with_eos(family, tuple(eos_token_ids))
    return Engine(model, dataclasses.replace(base_config(family), **options), runner=runner)


def run_to_completion(engine: Engine, max_steps: int = 500) -> dict[str, list[int]]:
    outputs = {}
    for _ in range(max_steps):
        if not engine.has_unfinished:
            return outputs
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    raise AssertionError(f"engine did not finish in {max_steps} steps")


# The suite compiles at XLA's lowest optimisation level (tests/conftest.py), which shortens the
# compiles of the many step variants but slows a program that runs many times: this reference runs
# once per greedy token. At level 2 it ran 3-7x faster on the 2-core machine (64 tokens: mamba2
# 3.3 -> 0.5 ms, nemotron_h 4.4 -> 1.5, qwen3_next 7.1 -> 2.0) and compiled no slower. Its logits
# differ from level 0's in the last bits, as a full recompute's already differ from the engine's
# (see GREEDY_TIE).
_OPTIMIZED = {"xla_backend_optimization_level": 2, "xla_llvm_disable_expensive_passes": False}


@per_module
def _naive_forward(family: str, max_len: int):
    model, _ = model_and_runner(family)
    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, compiler_options=_OPTIMIZED)
    def forward(params, inputs):
        caches = model.init_caches(
            num_blocks=max_len // BLOCK_SIZE + 1, block_size=BLOCK_SIZE, num_slots=2
        )
        logits, _ = nnx.merge(graphdef, params)(inputs, caches)
        return logits

    return functools.partial(forward, params)


def _whole_sequence_inputs(tokens: list[int], max_len: int) -> StepInputs:
    """The whole sequence as one prefill row from fresh caches, written independently of builder;
    logits at each of its max_len token lanes."""
    n, width = len(tokens), max_len // BLOCK_SIZE
    i32 = functools.partial(np.array, dtype=np.int32)
    padded = np.zeros(max_len, np.int32)
    padded[:n] = tokens
    positions = np.where(np.arange(max_len) < n, np.arange(max_len), 0).astype(np.int32)
    kv_slots = np.where(np.arange(max_len) < n, BLOCK_SIZE + np.arange(max_len), 0)
    table = np.where(np.arange(width) < -(-n // BLOCK_SIZE), 1 + np.arange(width), 0)
    empty = np.zeros((0,), np.int32)
    decode = DecodeRows(
        empty, empty, empty, np.zeros((0, 1), np.int32), np.zeros((0, width), np.int32)
    )
    prefill = PrefillRows(
        i32([0, n]),
        i32([0]),
        i32([n]),
        np.array([False]),
        i32([0]),
        i32([1]),
        table[None].astype(np.int32),
    )
    logits_at = np.arange(max_len, dtype=np.int32)
    return StepInputs(padded, positions, kv_slots.astype(np.int32), decode, prefill, logits_at)


def _recompute(family: str, tokens: list[int], max_len: int) -> np.ndarray:
    """[max_len, vocab] host copy of one full recompute of `tokens` (a causal model: lane i sees
    only tokens[: i + 1]); fresh caches, the whole sequence as one prefill row, one compiled
    forward per family and `max_len`. Rows are picked on the host: indexing the device array
    would compile a slicing program per length."""
    return np.asarray(_naive_forward(family, max_len)(_whole_sequence_inputs(tokens, max_len)))


def naive_logits_each(family: str, tokens: list[int], max_len: int = MAX_MODEL_LEN) -> np.ndarray:
    """[len(tokens), vocab] float64: row i holds the next-token logits after tokens[: i + 1], all
    from one full recompute of `tokens`."""
    return _recompute(family, tokens, max_len)[: len(tokens)].astype(np.float64)


def naive_logits(family: str, tokens: list[int], max_len: int = MAX_MODEL_LEN) -> np.ndarray:
    """[vocab] float64 next-token logits after `tokens`, by full recompute."""
    return _recompute(family, tokens, max_len)[len(tokens) - 1].astype(np.float64)


def naive_greedy(
    family: str,
    prompt: list[int],
    max_tokens: int,
    stop_ids: tuple[int, ...] | None = None,
    min_tokens: int = 0,
    max_len: int = MAX_MODEL_LEN,
) -> list[int]:
    """Greedy tokens by full recompute: fresh caches, the whole sequence as one prefill row.

    Stops after a token of `stop_ids` (default: the model's EOS ids) once more than `min_tokens`
    are generated (before that their logits are -inf), or at `max_len` tokens in all (a multiple
    of BLOCK_SIZE; one compiled forward per family and length).
    """
    tokens = list(prompt)
    stop_ids = jmamba.presets.tiny(family).eos_token_ids if stop_ids is None else stop_ids
    for step in range(min(max_tokens, max_len - len(prompt))):
        logits = naive_logits(family, tokens, max_len)
        if step < min_tokens:
            logits[list(stop_ids)] = -np.inf
        tokens.append(int(np.argmax(logits)))
        if tokens[-1] in stop_ids and step >= min_tokens:
            break
    return tokens[len(prompt) :]


# Two fp32 logits this close are a tie: the engine's chunked prefill and decode round differently
# from a full recompute, so either token is greedy. Hypothesis found one (nemotron_h, a 53-token
# prompt, the 17th token: its two best logits 2.4e-7 apart, one ulp at 2.5).
GREEDY_TIE = 1e-5


def assert_greedy(
    family: str, prompt: list[int], got: list[int], max_tokens: int, max_len: int = MAX_MODEL_LEN
) -> None:
    """`got` equals `naive_greedy` token for token, up to the first position where the two differ
    on a tie (the reference's logits of both tokens within GREEDY_TIE), after which the two
    continue from different texts and anything may follow.

    Checked by teacher forcing: one full recompute of prompt + got gives the reference's logits
    after every prefix of `got`, which are `naive_greedy`'s wherever `got` still agrees with it.
    """
    stop_ids = jmamba.presets.tiny(family).eos_token_ids
    limit = min(max_tokens, max_len - len(prompt))
    logits = naive_logits_each(family, list(prompt) + list(got[:limit]), max_len)
    for i, ours in enumerate(got[:limit]):
        row = logits[len(prompt) + i - 1]
        theirs = int(np.argmax(row))
        if ours != theirs:
            gap = row[theirs] - row[ours]
            assert gap <= GREEDY_TIE, f"token {i}: {ours} where greedy is {theirs} by {gap:.3g}"
            return
        if ours in stop_ids:
            assert len(got) == i + 1, f"{len(got) - i - 1} tokens after the stop token {i}"
            return
    assert len(got) == limit, f"{len(got)} tokens where greedy makes {limit}"


@pytest.fixture(params=quick_first(FAMILIES))
def family(request) -> str:
    return request.param
