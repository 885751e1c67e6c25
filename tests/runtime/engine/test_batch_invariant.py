"""`EngineConfig.batch_invariant`: the compiled steps run every projection (the layers' `Linear`s
and the LM head) through the fixed-tile matmul and every norm's sums of squares through
`row_sum_squares`, and serve the same greedy tokens as a naive loop.

On the CPU both ops run their references, so here they are replaced by their kernels in interpret
mode: the engine then serves through the kernels themselves. Whether the kernels' rounding is
independent of the batch is checked on the GPU (benchmarks/gpu_checks.py: their grid points, and
the bf16 section's bitwise together-and-alone run) and in interpret mode by
tests/pallas_kernels/matmul/test_matmul.py and test_row_sum_squares.py.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

import jmamba.presets
from pallas_kernels import ops
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from runtime.speculative.draft_model import draft_engine_args
from tests.runtime.conftest import (
    base_config,
    model_and_runner,
    naive_greedy,
    run_to_completion,
)

FAMILY = "nemotron_h"  # Mamba2, attention and MLP layers: every kind of projection


def test_steps_run_the_fixed_order_kernels_and_equal_the_naive_loop(monkeypatch):
    calls, norms = [], []
    interpreted = functools.partial(ops.matmul, implementation="interpret")
    sums = functools.partial(ops.row_sum_squares, implementation="interpret")

    def counted(*args, **kwargs):
        calls.append(args[1].shape)  # traced once per product per compiled variant
        return interpreted(*args, **kwargs)

    monkeypatch.setattr(ops, "matmul", counted)
    monkeypatch.setattr(ops, "row_sum_squares", lambda x: norms.append(x.shape) or sums(x))
    model, _ = model_and_runner(FAMILY)
    engine = Engine(model, dataclasses.replace(base_config(FAMILY), batch_invariant=True))
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 256, n).tolist() for n in (1, 13, 21)]
    ids = [engine.add_request(p, SamplingParams(max_tokens=4)) for p in prompts]
    outputs = run_to_completion(engine)
    for request_id, prompt in zip(ids, prompts, strict=True):
        assert outputs[request_id] == naive_greedy(FAMILY, prompt, 4), len(prompt)
    vocab = engine.model_config.vocab_size
    assert any(shape[-1] == vocab for shape in calls), "the LM head runs the kernel too"
    assert len({shape for shape in calls}) >= 4  # in / out projections, MLP, attention, head
    hidden, mamba = engine.model_config.hidden_size, engine.model_config.mamba2
    group = mamba.num_heads * mamba.head_dim // mamba.n_groups
    assert {shape[1] for shape in norms} == {hidden, group}  # the RMSNorms, the gated norm


def test_a_runner_is_shared_only_with_the_same_setting():
    model, runner = model_and_runner(FAMILY)
    with pytest.raises(ValueError, match="batch_invariant=True differs from the shared runner"):
        Engine(model, dataclasses.replace(base_config(FAMILY), batch_invariant=True), runner=runner)


def test_the_draft_model_runs_as_the_target_does():
    config = dataclasses.replace(base_config(FAMILY), batch_invariant=True)
    assert draft_engine_args(config.for_model(jmamba.presets.tiny(FAMILY))).batch_invariant


def test_bad_value_raises():
    with pytest.raises(ValueError, match="batch_invariant"):
        EngineArgs(batch_invariant=1)
