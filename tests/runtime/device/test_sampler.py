"""On-device sampling against independent float64 numpy references.

Distributions are checked with Pearson's chi-square test on a 5-token vocabulary with known
logits: many rows of the same logits with distinct (seed, counter) pairs are many independent
draws. The draws are deterministic (fixed seeds), so a test passes or fails the same way every
run; the critical value at ALPHA = 1e-3 is computed here (scipy is not a dependency) from the
chi-square survival function, itself checked against its closed forms for 2 and 4 degrees of
freedom. With N = 20_000 draws, a sampler that ignores temperature or collapses top-p to top-1
gives statistics in the thousands, far above critical values of 14-19.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from runtime.core.sampling_inputs import SamplingInputs, SamplingMode, mask_width
from runtime.device.sampler import sample

sample_jit = jax.jit(sample, static_argnums=2)
ALPHA = 1e-3
N = 20_000
# Probabilities 0.4, 0.3, 0.2, 0.06, 0.04: distinct, no ties at any top-p boundary used below.
LOGITS5 = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))


def inputs(n, temperature=1.0, top_k=0, top_p=1.0, seeds=None, counters=None, masked=None):
    """SamplingInputs for n rows; scalars are broadcast, `masked` is a list of ids per row."""
    full = lambda v, dtype: np.broadcast_to(np.asarray(v, dtype), (n,)).copy()  # noqa: E731
    masked = [()] * n if masked is None else masked
    masked_ids = np.zeros((n, mask_width(max(map(len, masked)))), np.int32)
    for row, ids in enumerate(masked):
        masked_ids[row, : len(ids)] = ids
    return SamplingInputs(
        full(temperature, np.float32),
        full(top_k, np.int32),
        full(top_p, np.float32),
        np.arange(n, dtype=np.uint32) if seeds is None else full(seeds, np.uint32),
        np.zeros(n, np.int32) if counters is None else full(counters, np.int32),
        masked_ids,
        np.array([len(ids) for ids in masked], np.int32),
    )


def draw(logits: np.ndarray, params: SamplingInputs) -> np.ndarray:
    logits = np.broadcast_to(logits, (params.temperature.size, logits.shape[-1]))
    return np.asarray(sample_jit(logits.astype(np.float32), params, SamplingMode.of(params)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, masked=()) -> np.ndarray:
    """float64 reference: mask, scale, keep the top-k and the top-p nucleus, renormalise."""
    x = np.array(logits, np.float64)
    x[list(masked)] = -np.inf
    p = softmax(x / temperature)
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(p.size, bool)
    mass = 0.0
    for rank, token in enumerate(order):
        if (top_k and rank >= top_k) or mass >= top_p or p[token] == 0:
            break
        keep[token] = True
        mass += p[token]
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat), X ~ chi-square(df): 1 - P(df/2, stat/2), the regularised lower incomplete
    gamma by its power series (fine for the stat <= ~100 that the bisection below visits)."""
    a, x = df / 2, stat / 2
    if x <= 0:
        return 1.0
    term = total = 1.0 / a
    n = 0
    while term > 1e-17 * total:
        n += 1
        term *= x / (a + n)
        total += term
    return max(0.0, 1.0 - total * math.exp(a * math.log(x) - x - math.lgamma(a)))


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """The stat whose survival probability is alpha (bisection on a monotone function)."""
    low, high = 0.0, 10.0 * df + 100.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_sf(mid, df) > alpha else (low, mid)
    return high


def assert_distribution(tokens: np.ndarray, probs: np.ndarray) -> None:
    """Tokens of zero probability never occur; the rest pass Pearson's chi-square test."""
    counts = np.bincount(tokens, minlength=probs.size)
    assert counts[probs == 0].sum() == 0, f"impossible tokens drawn: {counts} for {probs}"
    live = probs > 0
    expected = probs[live] * tokens.size
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    assert df == 0 or stat < chi2_critical(df), f"chi2={stat:.1f} (df={df}): {counts} vs {expected}"


def test_chi2_helpers_match_closed_forms():
    """sf(x; 2) = exp(-x/2), sf(x; 4) = exp(-x/2)(1 + x/2); known 0.999 quantiles."""
    for x in (0.1, 1.0, 5.0, 13.8):
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
        assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-9)
    assert chi2_critical(2) == pytest.approx(13.8155, abs=1e-3)
    assert chi2_critical(4) == pytest.approx(18.4668, abs=1e-3)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_scales_the_distribution(temperature):
    tokens = draw(LOGITS5, inputs(N, temperature=temperature))
    assert_distribution(tokens, reference_probs(LOGITS5, temperature))


def test_one_requests_stream_follows_the_distribution():
    """One seed, counters 0..N-1 (the tokens of one long request): the same distribution."""
    tokens = draw(LOGITS5, inputs(N, temperature=0.8, seeds=1234, counters=np.arange(N)))
    assert_distribution(tokens, reference_probs(LOGITS5, 0.8))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_top_k_keeps_the_k_most_likely(top_k):
    tokens = draw(LOGITS5, inputs(N, temperature=1.5, top_k=top_k))
    assert_distribution(tokens, reference_probs(LOGITS5, 1.5, top_k=top_k))


@pytest.mark.parametrize("top_p", [0.35, 0.5, 0.8, 0.95])
def test_top_p_keeps_the_nucleus(top_p):
    """top_p 0.5 keeps 2 tokens, 0.8 keeps 3, 0.95 keeps 4 (renormalised), 0.35 keeps 1."""
    tokens = draw(LOGITS5, inputs(N, top_p=top_p))
    assert_distribution(tokens, reference_probs(LOGITS5, top_p=top_p))


def test_temperature_top_k_and_top_p_together():
    tokens = draw(LOGITS5, inputs(N, temperature=1.7, top_k=4, top_p=0.9))
    assert_distribution(tokens, reference_probs(LOGITS5, 1.7, top_k=4, top_p=0.9))


def test_masked_tokens_are_never_drawn_and_the_rest_renormalise():
    """A row short of min_tokens masks its stop ids: sampled and greedy rows alike."""
    sampled = draw(LOGITS5, inputs(N, masked=[(0, 2)] * N))
    assert_distribution(sampled, reference_probs(LOGITS5, masked=(0, 2)))
    greedy = draw(LOGITS5, inputs(4, temperature=0.0, masked=[(0,), (0, 1), (), (1, 1)]))
    assert greedy.tolist() == [1, 2, 0, 0]  # a repeated id is harmless


def test_greedy_and_sampled_rows_in_one_batch():
    """Even rows greedy (exactly argmax), odd rows sampled at T=1.3 (its distribution)."""
    rng = np.random.default_rng(0)
    logits = np.tile(LOGITS5, (N, 1)) + np.where(
        np.arange(N)[:, None] % 2 == 0, rng.normal(size=(N, 5)), 0.0
    )
    temperature = np.where(np.arange(N) % 2 == 0, 0.0, 1.3)
    params = inputs(N, temperature=temperature, top_p=np.where(temperature > 0, 0.95, 1.0))
    assert SamplingMode.of(params) == SamplingMode(sampled=True, filtered=True, mask_width=0)
    tokens = draw(logits, params)
    np.testing.assert_array_equal(tokens[0::2], logits[0::2].argmax(-1))
    assert_distribution(tokens[1::2], reference_probs(LOGITS5, 1.3, top_p=0.95))


def test_greedy_is_argmax_of_random_logits():
    logits = np.random.default_rng(1).normal(size=(64, 1000)).astype(np.float32)
    tokens = draw(logits, inputs(64, temperature=0.0))
    np.testing.assert_array_equal(tokens, logits.argmax(-1))


def test_same_seed_and_counter_same_token_whatever_the_row():
    """A request's draw depends on (seed, counter) only, not on its row or its neighbours."""
    seeds = np.array([7, 7, 8, 9, 7, 1], np.uint32)
    logits = np.random.default_rng(0).normal(size=(1, 32)).astype(np.float32)
    tokens = draw(logits, inputs(6, seeds=seeds))
    assert tokens[0] == tokens[1] == tokens[4]
    shifted = draw(logits, inputs(6, seeds=seeds[::-1], temperature=[0.0, 0, 1, 1, 1, 1]))
    np.testing.assert_array_equal(shifted[2:], tokens[::-1][2:])


def test_different_seeds_give_different_streams():
    """20 seeds x 64 counters over 32 near-uniform tokens: all 20 streams differ pairwise and
    a seed's stream is the same when drawn again."""
    logits = np.zeros((1, 32), np.float32)
    seeds, counters = np.repeat(np.arange(20), 64), np.tile(np.arange(64), 20)
    streams = draw(logits, inputs(seeds.size, seeds=seeds, counters=counters)).reshape(20, 64)
    assert len({tuple(s) for s in streams}) == 20
    again = draw(logits, inputs(64, seeds=5, counters=np.arange(64)))
    np.testing.assert_array_equal(again, streams[5])


def test_mode_decides_what_runs():
    """Greedy-only steps draw nothing; filtering only when a sampled row asks for it."""
    assert SamplingMode.of(inputs(3, temperature=0.0, top_k=5)) == SamplingMode(False, False, 0)
    assert SamplingMode.of(inputs(3, temperature=[0, 1, 0], top_p=[0.5, 1, 1])) == SamplingMode(
        True, False, 0
    )
    assert SamplingMode.of(inputs(2, masked=[(3,), ()])).mask_width == 4
