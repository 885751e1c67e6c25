"""The allowed-token bitmask: packed on the host, applied by the sampler on the device exactly as
a plain numpy reference masks, and filled by a request's grammar matcher lane by lane."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.allowed_tokens import allowed_bitmask, bitmask_words
from runtime.core.structured_output import StructuredOutput
from runtime.device.sampler import apply_bitmask
from runtime.structured import GrammarCompiler
from runtime.structured.matcher import packed_tokens
from tests.runtime.structured.byte_tokenizer import EOS, byte_tokenizer


def reference_mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Token t of row r is kept iff bit t % 32 of word t // 32 of allowed[r] is set."""
    out = logits.copy()
    for r in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not (int(allowed[r, t // 32]) >> (t % 32)) & 1:
                out[r, t] = -np.inf
    return out


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(1, 100), seed=st.integers(0, 2**31))
def test_apply_bitmask_matches_numpy(rows: int, vocab: int, seed: int):
    """The device's unpacking keeps exactly the tokens whose bits are set (bit 31 included)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    allowed = rng.integers(-(2**31), 2**31, (rows, bitmask_words(vocab)), dtype=np.int64)
    allowed = allowed.astype(np.int32)
    masked = np.asarray(apply_bitmask(jnp.asarray(logits), jnp.asarray(allowed)))
    np.testing.assert_array_equal(masked, reference_mask(logits, allowed))


def test_all_ones_rows_come_back_bit_for_bit():
    """An unconstrained row (every bit set) is its logits exactly."""
    logits = np.random.default_rng(0).standard_normal((3, 70)).astype(np.float32)
    allowed = allowed_bitmask(3, 70)
    assert allowed is not None and allowed.shape == (3, 3) and (allowed == -1).all()
    np.testing.assert_array_equal(np.asarray(apply_bitmask(jnp.asarray(logits), allowed)), logits)


@pytest.mark.parametrize("tokens", [[0], [31], [32, 63], [5, 31, 64, 95]])
def test_packed_tokens_allow_exactly_those(tokens: list[int]):
    row = packed_tokens(tokens, 3)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    assert np.flatnonzero(bits).tolist() == tokens


def allowed_ids(bitmask: np.ndarray, row: int) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")))


def test_matcher_fills_each_draft_lane_and_stops_at_a_refused_draft():
    """Lane t is the grammar after t drafts; a refused draft leaves the lanes after it as they
    were; the matcher itself stays after the outputs alone."""
    compiler = GrammarCompiler(byte_tokenizer(), (EOS,))
    matcher = compiler.matcher(StructuredOutput(choice=("yes", "no")))
    bitmask = np.full((4, bitmask_words(EOS + 1)), -1, np.int32)
    matcher.fill(bitmask, 0, [], [ord("y"), ord("x"), ord("s")])
    assert allowed_ids(bitmask, 0) == {ord("y"), ord("n")}
    assert allowed_ids(bitmask, 1) == {ord("e")}
    assert (bitmask[2:] == -1).all()  # past the refused draft "x"
    matcher.fill(bitmask, 0, [ord("n"), ord("o")])
    assert allowed_ids(bitmask, 0) == {EOS}


def test_compiled_grammars_are_cached_per_spec():
    compiler = GrammarCompiler(byte_tokenizer(), (EOS,))
    spec = StructuredOutput(regex="[0-9]+")
    compiler.matcher(spec)
    compiler.matcher(StructuredOutput(regex="[0-9]+"))
    assert list(compiler._compiled) == [spec]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"regex": "a("}, "unclosed group"),
        ({"json": "{not json"}, "not JSON"),
        ({"json": {"type": "objectx"}}, "objectx"),
        ({"choice": []}, "non-empty"),
        ({"choice": "ab"}, "non-empty"),
        ({"grammar": ""}, "non-empty str"),
    ],
)
def test_bad_specs_are_refused_when_made(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        StructuredOutput(**options)
