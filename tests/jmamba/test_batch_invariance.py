"""A request's output does not depend on its batch, on CPU through the jnp references.

The same property as the GPU check `benchmarks/checks/batch_invariance.py` (which runs the kernels
and 64 prompts per model), on two fixture models: 8 prompts of lengths around the kernel chunk
(1, chunk - 1, chunk, chunk + 1, 2 chunk + 2, and random up to 150) prefilled in one step, then each
alone in a fresh engine sharing the compiled steps and the (now dirty) pools.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.checks import batch_invariance as bi
from jmamba import load_pretrained
from tests.jmamba import fixture_runs as runs

SETUP = bi.Setup(num_prompts=8, max_tokens=3, seed=1)


@pytest.mark.parametrize("name", ["nemotron_h", "qwen3_5_odd"])
def test_prompt_output_does_not_depend_on_its_batch(name, monkeypatch):
    monkeypatch.setenv("JMAMBA_KERNELS", "reference")
    model = load_pretrained(runs.FIXTURES / name)
    prompts, together, alone, engine = bi.together_and_alone(model, SETUP)
    lengths = sorted(len(p) for p in prompts)
    assert lengths[-1] > 2 * model.config.chunk_size  # some prompts span several kernel chunks
    # together: one prefill bucket of 8 rows, one decode bucket; alone: 1 row, 256 tokens; decode
    assert engine.num_variants == 4
    for i, (t, a) in enumerate(zip(together, alone, strict=True)):
        assert t.tokens and t.tokens == a.tokens, f"prompt {i} (length {len(prompts[i])})"
        error = max(float(np.abs(x - y).max()) for x, y in zip(t.logits, a.logits, strict=True))
        assert error <= bi.TOL, f"prompt {i} (length {len(prompts[i])}): logits differ by {error}"


def test_compare_finds_the_first_differing_token():
    """`compare` (used by the GPU check) stops at the first differing token and flags NaN."""
    rows = [np.zeros(4, np.float32), np.ones(4, np.float32), np.full(4, 2.0, np.float32)]
    same = bi.Generated([5, 6, 7], rows)
    other = bi.Generated([5, 9, 1], [rows[0], rows[1] + 1e-3, rows[2] + 5.0])
    assert bi.compare(same, same) == (0.0, None)
    error, differ = bi.compare(same, other)
    # Step 2 is where the tokens differ; its inputs were equal, step 3's were not (not compared).
    assert differ == 1 and error == pytest.approx(1e-3, rel=1e-3)
    assert bi.compare(same, bi.Generated([5, 6], rows[:2]))[1] == 2
    assert bi.compare(same, bi.Generated([5, 6, 7], [rows[0] * np.nan] + rows[1:]))[0] == np.inf
