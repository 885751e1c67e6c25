"""Draft verification in the sampler keeps the target distribution (chi-square, float64 references).

N rows of two lanes: lane 0 has known logits, lane 1 feeds a deterministic draft d. Rejection
sampling must accept d with probability p(d), otherwise give a token of the residual distribution
(p without d, renormalised), so the row's output token (d if accepted, else lane 0's token)
follows p = softmax(filtered logits / T). Each row draws from its own (seed, counter) stream.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from jmamba.step.pytree import DecodeRows, PrefillRows, StepInputs
from runtime.core.sampling_inputs import SamplingMode
from runtime.device.sampler import accept_drafts, sample
from tests.runtime.device.test_sampler import (
    LOGITS5,
    N,
    assert_distribution,
    inputs,
    reference_probs,
)


def step_inputs(
    drafts: np.ndarray, query_lens: np.ndarray, width: int, num_prefill_rows: int = 0
) -> StepInputs:
    """Decode rows whose lane t + 1 feeds drafts[r, t]; only the fields the verifier reads are
    filled (token ids and query lengths), the rest are shaped zeros."""
    rows = query_lens.size
    i32 = functools.partial(np.zeros, dtype=np.int32)
    tokens = i32((rows, width))
    tokens[:, 1:] = drafts
    tokens = np.where(np.arange(width)[None, :] < query_lens[:, None], tokens, 0)
    num_tokens = rows * width + num_prefill_rows
    decode = DecodeRows(
        query_lens.astype(np.int32), i32(rows), i32(rows), i32((rows, width)), i32((rows, 1))
    )
    prefill = PrefillRows(
        np.arange(num_prefill_rows + 1, dtype=np.int32),
        i32(num_prefill_rows),
        i32(num_prefill_rows),
        np.zeros(num_prefill_rows, bool),
        i32(num_prefill_rows),
        i32(num_prefill_rows),
        i32((num_prefill_rows, 1)),
    )
    flat = np.concatenate([tokens.reshape(-1), np.full(num_prefill_rows, 9, np.int32)])
    return StepInputs(
        flat,
        i32(num_tokens),
        i32(num_tokens),
        decode,
        prefill,
        i32(rows * width + num_prefill_rows),
    )


@functools.partial(jax.jit, static_argnums=3)
def verify(logits, params, step, mode):
    tokens = sample(logits, params, mode)
    return tokens, accept_drafts(tokens, step)


def verified_rows(logits5: np.ndarray, draft: int, **sampling) -> tuple[np.ndarray, np.ndarray]:
    """(accepted [N] bool, lane-0 token [N]) of N two-lane rows with lane-0 logits `logits5`."""
    logits = np.zeros((N, 2, 5), np.float32)
    logits[:, 0] = logits5
    params = inputs(
        2 * N, seeds=np.repeat(np.arange(N), 2), counters=np.tile([0, 1], N), **sampling
    )
    step = step_inputs(np.full((N, 1), draft), np.full(N, 2), 2)
    tokens, accepted = verify(logits.reshape(2 * N, 5), params, step, SamplingMode.of(params))
    return np.asarray(accepted)[0::2], np.asarray(tokens)[0::2]


@pytest.mark.parametrize(("draft", "temperature"), [(1, 1.0), (0, 0.7), (3, 1.6)])
def test_rejection_sampling_keeps_the_target_distribution(draft, temperature):
    p = reference_probs(LOGITS5, temperature)
    accepted, tokens = verified_rows(LOGITS5, draft, temperature=temperature)
    # Accepted with probability p(d): a two-cell chi-square test (accept, reject).
    assert_distribution(accepted.astype(np.int64), np.array([1 - p[draft], p[draft]]))
    residual = np.where(np.arange(5) == draft, 0.0, p) / (1 - p[draft])
    assert_distribution(tokens[~accepted], residual)  # d itself is never the rejection's token
    output = np.where(accepted, draft, tokens)
    assert_distribution(output, p)


def test_a_draft_outside_the_nucleus_is_never_accepted():
    """top_p = 0.5 keeps tokens 0 and 1: draft 2 is always rejected; output is the nucleus."""
    accepted, tokens = verified_rows(LOGITS5, 2, top_p=0.5)
    assert not accepted.any()
    assert_distribution(tokens, reference_probs(LOGITS5, top_p=0.5))


def test_greedy_rows_accept_exactly_the_argmax():
    logits = np.random.default_rng(0).normal(size=(6, 3, 5)).astype(np.float32)
    best = logits.argmax(-1)  # [rows, lanes]
    drafts = best[:, :2].copy()
    drafts[1, 0] = (drafts[1, 0] + 1) % 5  # row 1: first draft wrong (second right, ignored)
    drafts[2, 1] = (drafts[2, 1] + 1) % 5  # row 2: second draft wrong
    query_lens = np.array([3, 3, 3, 2, 1, 0])  # row 3 one draft, row 4 none, row 5 padding
    step = step_inputs(drafts, query_lens, 3, num_prefill_rows=2)
    params = inputs(6 * 3 + 2, temperature=0.0)
    all_logits = np.concatenate([logits.reshape(18, 5), np.zeros((2, 5), np.float32)])
    tokens, accepted = verify(all_logits, params, step, SamplingMode.of(params))
    np.testing.assert_array_equal(np.asarray(tokens)[:18].reshape(6, 3), best)
    expected = np.zeros((6, 3), bool)
    expected[0, :2] = expected[1, 1] = expected[2, 0] = expected[3, 0] = True
    np.testing.assert_array_equal(np.asarray(accepted)[:18].reshape(6, 3), expected)
    assert not np.asarray(accepted)[18:].any()  # prefill rows verify nothing
