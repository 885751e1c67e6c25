"""docs/architecture.md section 5 on the running engine: dummy steps, poisoned NULL entries, aborts.

Bad input (one test per class) is in test_bad_input.py.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jmamba.loading import load_model
from runtime.core.buckets import Bucket
from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import make_engine, model_and_runner, run_to_completion


def host_caches(runner) -> list[np.ndarray]:
    return [np.array(leaf) for leaf in jax.tree.leaves(runner.caches)]


def test_dummy_step_changes_no_live_entry(family):
    """All-padding steps (decode-only and mixed buckets) leave every non-NULL slot/block as is."""
    engine = make_engine(family)
    engine.add_request(list(range(1, 30)), SamplingParams(max_tokens=3))
    run_to_completion(engine)
    before = host_caches(engine.runner)
    assert any(np.abs(b[1:]).sum() > 0 for b in before)  # live entries hold real state
    engine.runner.warmup(
        [Bucket(4, 1, 0, 0), Bucket(4, 1, engine.config.max_num_batched_tokens, 4)]
    )
    for old, new in zip(before, host_caches(engine.runner), strict=True):
        np.testing.assert_array_equal(new[1:], old[1:])


def test_nan_in_null_slot_and_block_changes_no_output(family):
    """Slot 0 and block 0 full of NaN: same tokens and bit-identical logits; live entries finite."""
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 256, n).tolist() for n in (3, 21, 9)]

    def run() -> list[np.ndarray]:
        engine = make_engine(family)
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(max_tokens=4))
        logits = []
        while engine.has_unfinished:
            engine.step()
            logits.append(engine.last_result.logits[0][engine.inspect.last_batch.sample_rows])
        return logits

    clean_logits = run()
    _, runner = model_and_runner(family)
    runner.caches = jax.tree.map(lambda leaf: leaf.at[0].set(jnp_nan(leaf)), runner.caches)
    poisoned_logits = run()
    assert len(clean_logits) == len(poisoned_logits)
    for clean, poisoned in zip(clean_logits, poisoned_logits, strict=True):
        np.testing.assert_array_equal(poisoned, clean)
    assert all(np.isfinite(leaf[1:]).all() for leaf in host_caches(runner))
    runner.caches = jax.tree.map(lambda leaf: leaf.at[0].set(0), runner.caches)


def jnp_nan(leaf):
    return np.nan if np.issubdtype(leaf.dtype, np.floating) else 0


def test_bad_model_names(tmp_path):
    """Unknown presets and incomplete checkpoint directories are named in the error."""
    with pytest.raises(ValueError, match="unknown preset 'tiny-gpt'"):
        load_model("tiny-gpt")
    with pytest.raises(ValueError, match="neither a checkpoint directory nor a preset"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mamba2ForCausalLM"]}))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(str(tmp_path))


def test_abort_mid_generation_frees_and_others_continue():
    engine = make_engine("nemotron_h")
    a = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=8))
    b = engine.add_request(list(range(3, 9)), SamplingParams(max_tokens=4))
    engine.step()
    engine.step()
    aborted = engine.abort(a)
    assert aborted.finish_reason == "abort" and engine.abort(a) is None
    assert len(run_to_completion(engine)[b]) == 4
    assert engine.inspect.scheduler.block_pool.num_used == 0
