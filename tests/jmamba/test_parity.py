"""Parity with transformers (the independent reference) on tiny random checkpoints of each family.

Fixtures are written by tests/reference/make_fixtures.py under transformers 5.23.0: five with
power-of-two dims and 80 / 23 tokens, five `*_odd` ones with non-power-of-two head counts, head
dims, groups and channel counts and 181 / 65 tokens (several kernel chunks plus a remainder, chunk
boundaries off the kernel chunk grid), Falcon-H1's pair (`falcon_h1`, `falcon_h1_odd`: attention
beside Mamba2 in every layer, every muP multiplier away from 1), Bamba and Granite-4.0-H with one
of each (`fixture_runs.IBM`), and two Qwen3.5 checkpoints as published (`*_vl`: the multimodal
wrapper, its vision tower skipped, HF's logits those of text-only input), and Zamba2's pair (a
shared transformer block over [x | embeddings] feeding Mamba2, two blocks each used at two or more
layers, every use site's LoRA adapters folded into its copy). Our model loads the same
safetensors and must reproduce HF's logits and final states within 1e-4 (fp32): for a full
forward, and for chunked prefill followed by token-by-token decode with the states carried in our
pools at non-trivial slots, with padding rows and tokens in every batch, garbage in every pool
entry a request does not own, and NaN in the NULL slot and block (see
tests/jmamba/fixture_runs.py).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

from tests.jmamba import fixture_runs as runs
from tests.tiers import slow

TOL = 1e-4

# Every fixture through the jnp references; three again through the Pallas kernels (interpret
# mode on CPU), which checks how the mixers wire the kernels: Mamba2 + attention + MoE (odd dims),
# GDN with odd dims (the kernels' own tests cover power-of-two Mamba2 and GDN shapes; CI time),
# and the parallel attention + Mamba2 layer (odd dims, Mamba2 without a norm). Zamba2's block
# calls the same attention and Mamba2 mixers (27 s of CI interpreted); gpu_checks.py runs every
# fixture, Zamba2's too, through the compiled kernels. The interpreted ones run the chunked test
# only: its chunks are prefills with and without initial states and its tail is decode steps, so
# it wires every kernel the full forward does (21 s of CI saved).
# The quick tier runs each fixture of power-of-two dims through the references and the first
# odd-shaped one through the kernels; the slow tier (tests/tiers.py) the odd ones' repeats.
REFERENCE = [(f, "reference") for f in runs.ALL]
INTERPRETED = [
    ("nemotron_h_odd", "interpret"),
    ("qwen3_5_odd", "interpret"),
    ("falcon_h1_odd", "interpret"),
]


def tiered(cases: list[tuple[str, str]]) -> list:
    """Fixture params: odd-shaped references and all but the first interpreted case slow."""
    quick = {c for c in cases if not c[0].endswith("_odd") or c == INTERPRETED[0]}
    return [c if c in quick else pytest.param(c, marks=slow) for c in cases]


@contextlib.contextmanager
def kernels(implementation: str):
    """Pick the kernel implementation while the step is traced (`_dispatch` reads it then)."""
    previous = os.environ.get("JMAMBA_KERNELS")
    os.environ["JMAMBA_KERNELS"] = implementation
    try:
        yield
    finally:
        os.environ.pop("JMAMBA_KERNELS")
        if previous is not None:
            os.environ["JMAMBA_KERNELS"] = previous


def load(name: str, implementation: str) -> runs.Fixture:
    """The fixture, its step run with `implementation`'s kernels."""

    def wrap(jitted):
        def step(p, c, i):
            with kernels(implementation):
                return jitted(p, c, i)

        return step

    return runs.load(name, wrap)


@pytest.fixture(scope="module", params=tiered(REFERENCE), ids=lambda c: "-".join(c))
def reference_fixture(request) -> runs.Fixture:
    return load(*request.param)


@pytest.fixture(scope="module", params=tiered(REFERENCE + INTERPRETED), ids=lambda c: "-".join(c))
def fixture(request) -> runs.Fixture:
    return load(*request.param)


def assert_close(comparisons: list[runs.Comparison]) -> None:
    for c in comparisons:
        np.testing.assert_allclose(c.ours, c.theirs, atol=TOL, rtol=0, err_msg=c.name)


def test_full_forward_matches_transformers(reference_fixture):
    """One prefill step over both sequences (plus padding) gives HF's full-forward logits."""
    comparisons, padding = runs.run_full(reference_fixture)
    assert_close(comparisons)
    assert np.isfinite(padding).all()


def test_chunked_prefill_then_decode_matches_transformers(fixture):
    """Chunked prefill + decode through our pools reproduces HF's logits and final states."""
    assert runs.recurrent_layers(fixture) == list(fixture.expected["recurrent_layers"])
    comparisons, caches = runs.run_chunked(fixture)
    assert_close(comparisons + runs.final_states(fixture, caches))
    assert runs.null_slot_untouched(fixture, caches)


def test_chunk_schedule_positions():
    """The logit positions derived from a schedule: each chunk's last token, then every token."""
    assert runs.logit_positions(np.array([[0, 32], [32, 48]]), 52) == [31, 47, 48, 49, 50, 51]
    assert runs.logit_positions(np.array([[0, 33], [33, 61]]), 65) == [32, 60, 61, 62, 63, 64]
