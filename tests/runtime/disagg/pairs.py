"""What the P/D tests share: per family, one model and two runners (two sets of device caches:
the prefill engine's and the decode engine's, so a hand-over that wrote nothing cannot pass), and
the reference, one engine computing the same prompts alone (itself checked against transformers
and a full recompute by tests/runtime/engine/ and tests/jmamba/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jmamba
from runtime.core.budgets import min_token_budget
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.disagg.pool_rows import BLOCK, PoolRows, engine_pool_rows
from runtime.engine import Engine
from tests.compiled import per_module

PRESETS = ("mamba2", "nemotron_h", "qwen3_next")  # Mamba2; Mamba2 + attention; GDN + attention
FIXTURES = Path(__file__).parents[2] / "fixtures"
# Every other family's transformers fixture (Granite-4.0-H shares Bamba's cache layout and
# Qwen3.5 MoE the dense Qwen3.5's, but each has its own adapter and layer pattern).
FIXTURE_FAMILIES = ("falcon_h1", "zamba2", "bamba", "granite_h", "qwen3_5", "qwen3_5_moe")
# 5 tokens: one partial block; 16: two full blocks (the first decode takes a new one); 20: three
# blocks, which a hand-over writes as four (`pool_rows.padded_count`: the fourth, out of range,
# is dropped). 41 tokens fit one step's budget, so every prompt ends in the first step.
PROMPTS = (
    [3, 7, 11, 5, 9],
    [(5 * i + 2) % 97 + 1 for i in range(16)],
    [(3 * i) % 89 + 2 for i in range(20)],
)
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
DECODE_STEPS_COMPARED = 2  # the state is compared again after this many decode steps


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's model and its two runners (`a`: reference and prefill, `b`: decode)."""

    model: nnx.Module
    args: EngineArgs
    a: ModelRunner
    b: ModelRunner

    def engine(self, runner: ModelRunner, **options) -> Engine:
        return Engine(self.model, dataclasses.replace(self.args, **options), runner=runner)


def engine_args(chunk_size: int) -> EngineArgs:
    budget = max(48, min_token_budget(chunk_size, 4))
    return EngineArgs(
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        max_model_len=64,
        block_size=8,
        num_blocks=16,
        num_slots=6,
        decode_row_buckets=(4,),
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(4,),
        validate_inputs=True,
        prefix_caching="off",
    )


def load(name: str) -> nnx.Module:
    """A preset's random-weight model, or a transformers fixture's checkpoint."""
    if name in PRESETS:
        return jmamba.HybridLM(jmamba.presets.tiny(name), rngs=nnx.Rngs(0))
    model, _ = jmamba.load_model(str(FIXTURES / name))
    return model


@per_module
def family(name: str) -> Family:
    model = load(name)
    args = engine_args(model.config.chunk_size)
    config = resolve_config(model, args)
    return Family(model, args, ModelRunner(model, config), ModelRunner(model, config))


def request_rows(engine: Engine, rows: PoolRows, request_id: str) -> list[np.ndarray]:
    """A live request's rows that its computed tokens determine: per KV leaf its first
    `num_computed` token positions (the rest of its last block holds whatever was there), per
    state leaf its slot row."""
    request = engine.request(request_id)
    slots = engine.schedulers[0].slots
    slot = slots.read_slot(request) if slots.uses_slots else 0
    limit = engine.config.max_blocks_per_seq
    blocks, states = rows.read(engine.runner.caches, 0, request.block_ids, slot, limit)
    n = request.num_computed
    return [b.reshape(-1, *b.shape[2:])[:n] for b in blocks] + states


@dataclasses.dataclass(frozen=True)
class Reference:
    """One engine serving `PROMPTS` alone: its greedy tokens, and each request's rows after its
    prompt and after `DECODE_STEPS_COMPARED` more tokens were fed."""

    tokens: dict[str, list[int]]
    after_prompt: dict[str, list[np.ndarray]]
    after_decodes: dict[str, list[np.ndarray]]


@per_module
def reference(name: str) -> Reference:
    fam = family(name)
    engine = fam.engine(fam.a)
    rows = engine_pool_rows(engine)
    ids = [engine.add_request(p, PARAMS) for p in PROMPTS]
    engine.step()  # every prompt in one step, each with its first token
    return finished(engine, rows, ids)


def finished(engine: Engine, rows: PoolRows, ids: list[str]) -> Reference:
    """Requests `ids`, their prompts computed, run to the end: their rows now and after
    `DECODE_STEPS_COMPARED` decode steps, and their tokens."""
    after_prompt = {i: request_rows(engine, rows, i) for i in ids}
    for _ in range(DECODE_STEPS_COMPARED):
        engine.step()
    after_decodes = {i: request_rows(engine, rows, i) for i in ids}
    tokens = {}
    while engine.has_unfinished:
        tokens |= {o.request_id: o.token_ids for o in engine.step()}
    return Reference(tokens, after_prompt, after_decodes)


def host_caches(engine: Engine) -> list[np.ndarray]:
    """Every cache array of the engine's runner, copied to the host."""
    return [np.array(leaf) for leaf in jax.tree.leaves(engine.runner.caches)]


def rows_outside(caches: list[np.ndarray], rows: PoolRows, blocks: list[int], slots: list[int]):
    """Each cache array without the rows of `blocks` (block leaves) or `slots` (slot leaves)."""
    return [
        np.delete(leaf, blocks if kind == BLOCK else slots, axis=0)
        for leaf, kind in zip(caches, rows.kinds, strict=True)
    ]


def free_counts(engine: Engine) -> list[tuple[int, int]]:
    """(free KV blocks, free state slots) of each rank."""
    return [(s.block_pool.num_free, s.slot_pool.num_free) for s in engine.schedulers]


def assert_bitwise(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()  # bitwise (NaN-safe, -0.0 != 0.0)
