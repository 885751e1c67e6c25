"""On-device sampling: greedy, top-k, top-p and per-request seeds, against direct expectations."""

from __future__ import annotations

import jax
import numpy as np

from runtime.builder import SamplingInputs
from runtime.sampler import sample

sample_jit = jax.jit(sample)
VOCAB, ROWS = 32, 6


def params(temperature=1.0, top_k=0, top_p=1.0, seeds=None, counters=None) -> SamplingInputs:
    full = lambda v, dtype: np.full(ROWS, v, dtype)  # noqa: E731
    return SamplingInputs(full(temperature, np.float32), full(top_k, np.int32),
                          full(top_p, np.float32),
                          np.arange(ROWS, dtype=np.uint32) if seeds is None else seeds,
                          full(0, np.int32) if counters is None else counters)  # fmt: skip


LOGITS = np.random.default_rng(0).normal(size=(ROWS, VOCAB)).astype(np.float32)


def test_greedy_is_argmax():
    tokens = sample_jit(LOGITS, params(temperature=0.0))
    np.testing.assert_array_equal(tokens, LOGITS.argmax(-1))


def test_top_k_1_and_tiny_top_p_are_argmax():
    for p in (params(top_k=1), params(top_p=1e-6)):
        np.testing.assert_array_equal(sample_jit(LOGITS, p), LOGITS.argmax(-1))


def test_top_k_keeps_samples_in_the_top_k():
    """Over many seeds every sample is among the row's 3 largest logits; more than one occurs."""
    top3 = np.argsort(-LOGITS, axis=-1)[:, :3]
    seen = set()
    for seed in range(40):
        seeds = np.full(ROWS, seed, np.uint32)
        tokens = np.asarray(sample_jit(LOGITS, params(temperature=2.0, top_k=3, seeds=seeds)))
        assert all(t in top3[r] for r, t in enumerate(tokens))
        seen.add(int(tokens[0]))
    assert len(seen) > 1


def test_same_seed_and_counter_same_token_whatever_the_row():
    """A request's draw depends on (seed, counter) only, not on its row or its neighbours."""
    seeds = np.array([7, 7, 8, 9, 7, 1], np.uint32)
    same_logits = np.repeat(LOGITS[:1], ROWS, axis=0)
    tokens = np.asarray(sample_jit(same_logits, params(temperature=1.0, seeds=seeds)))
    assert tokens[0] == tokens[1] == tokens[4]
    shifted = np.asarray(sample_jit(same_logits[::-1], params(seeds=seeds[::-1])))
    np.testing.assert_array_equal(shifted[::-1], tokens)
