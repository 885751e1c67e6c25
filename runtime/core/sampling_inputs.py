"""`SamplingInputs`, `SamplingMode`, `TokenLogprobs`: the sampler's contract (no jax).

The builder fills one `SamplingInputs` row per logits row of a step; the sampler (inside the jitted
step) reads them. `SamplingMode` is what the sampler must compute this step, decided on the host
from those rows: it is static (part of the compiled variant's key), so the step holds no
data-dependent branch and never waits on a device predicate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from runtime.core.sampling_params import SamplingParams

MIN_MASK_WIDTH = 4  # masked-id columns come in powers of two from here, to bound the variants
MIN_PENALTY_WIDTH = 32  # penalty-table columns likewise (a short prompt and output fit in one)


class PenaltyInputs(NamedTuple):
    """Per-logits-row presence / frequency / repetition penalties (a pytree), present only in
    steps whose mode has a `penalty_width` P. Each penalized row lists the distinct tokens of its
    request's prompt and known outputs once; padding columns (id 0, count 0, not in the prompt)
    and rows without penalties (values 0, 0, 1: neutral) change nothing.

    Attributes:
      token_ids: [N, P] int32 the row's distinct prompt and output tokens.
      output_counts: [N, P] int32 how many of the request's known outputs are that token.
      in_prompt: [N, P] bool whether the prompt holds it.
      presence: [N] float32 presence penalty (0: none).
      frequency: [N] float32 frequency penalty (0: none).
      repetition: [N] float32 repetition penalty (1: none).
      pending: [N] bool the token this row was fed is an output the host has not seen yet (an
        asynchronous engine's decode row): the device counts it as one more output.
    """

    token_ids: np.ndarray
    output_counts: np.ndarray
    in_prompt: np.ndarray
    presence: np.ndarray
    frequency: np.ndarray
    repetition: np.ndarray
    pending: np.ndarray


class SamplingInputs(NamedTuple):
    """Per-logits-row sampling parameters (a pytree); padding rows are greedy and mask nothing.

    Attributes:
      temperature: [N] float32, 0 for greedy.
      top_k: [N] int32, 0 for no limit.
      top_p: [N] float32, 1 for no limit.
      seeds: [N] uint32 request seeds.
      counters: [N] int32 index of the token being sampled (folded into the seed's key, so a
        request's random stream does not depend on the batch).
      masked_ids: [N, M] int32 token ids the row may not produce now (its stop ids while it has
        fewer than `min_tokens` outputs); entries past `num_masked` are 0 and ignored.
      num_masked: [N] int32 live entries of `masked_ids`.
      penalties: the rows' `PenaltyInputs` in a step whose mode has a `penalty_width`, else None
        (no leaf: a step without penalties packs and computes nothing for them).
      allowed: [N, ceil(vocab / 32)] int32 packed allowed-token bitmask
        (`runtime.core.allowed_tokens`; all ones: unconstrained). Every engine step has it;
        None only in inputs built without a model's vocabulary (tests), which mask nothing.
    """

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    seeds: np.ndarray
    counters: np.ndarray
    masked_ids: np.ndarray
    num_masked: np.ndarray
    penalties: PenaltyInputs | None = None
    allowed: np.ndarray | None = None


class TokenLogprobs[T](NamedTuple):
    """Log-probabilities of one step's rows, the sampler's optional output (a pytree:
    `TokenLogprobs[jax.Array]` in the step, `TokenLogprobs[np.ndarray]` on the host).

    Attributes:
      sampled: [N] float32, log-probability of each row's sampled token.
      top_ids: [N, K] int32, the row's K most likely tokens, most likely first.
      top_logprobs: [N, K] float32, their log-probabilities.
    """

    sampled: T
    top_ids: T
    top_logprobs: T


@dataclasses.dataclass(frozen=True)
class SamplingMode:
    """What one step's sampler computes (static per compiled variant).

    Attributes:
      sampled: some row has temperature > 0; otherwise every row is an argmax and no random
        numbers are drawn.
      filtered: some sampled row has top_k > 0 or top_p < 1, so the sort for top-k/top-p runs.
      mask_width: M, the columns of `masked_ids`; 0 when no row masks a token.
      logprobs: some row asks for log-probabilities: the step also returns every row's sampled
        token's log-probability and its `top_logprobs` most likely tokens. Off, the step's outputs
        are the tokens alone.
      top_logprobs: K, the top log-probability columns (a power of two >= the largest k asked,
        or 0); rows keep their own first k.
      penalty_width: P, the columns of the `PenaltyInputs` tables (a power of two >= the most
        distinct tokens a penalized row's request holds); 0 when no row is penalized.
    """

    sampled: bool = False
    filtered: bool = False
    mask_width: int = 0
    logprobs: bool = False
    top_logprobs: int = 0
    penalty_width: int = 0

    NUM_FIELDS = 6

    def as_array(self) -> np.ndarray:
        """[NUM_FIELDS] int32: data-parallel ranks agree on one mode by the elementwise max (a mode
        that computes more than a row needs gives that row the same token)."""
        fields = (self.sampled, self.filtered, self.mask_width, self.logprobs)
        return np.array([*fields, self.top_logprobs, self.penalty_width], np.int32)

    @classmethod
    def from_array(cls, values: np.ndarray) -> SamplingMode:
        sampled, filtered, mask, logprobs, top, penalty = values.tolist()
        return cls(bool(sampled), bool(filtered), mask, bool(logprobs), top, penalty)

    @classmethod
    def of_requests(cls, requests: Sequence[SamplingRequest]) -> SamplingMode:
        """The mode a step serving `requests` needs (what `of` gives for the rows the builder
        fills from them), before any array is built. Reads each request's `sampling_needs`;
        the requests' progress only where some request has a `min_tokens`."""
        needs = {request.sampling_needs for request in requests}  # a few distinct ones
        longest_mask = 0
        if any(need.min_tokens for need in needs):
            longest_mask = max(
                (
                    len(r.stop_ids)
                    for r in requests
                    if len(r.output_token_ids) < r.sampling_params.min_tokens
                ),
                default=0,
            )
        asked = [need.logprobs for need in needs if need.logprobs is not None]
        penalized = any(need.penalized for need in needs)
        return cls(
            any(need.sampled for need in needs),
            any(need.filtered for need in needs),
            mask_width(longest_mask),
            bool(asked),
            top_logprobs_width(max(asked, default=0)),
            penalty_width(_most_penalized_tokens(requests)) if penalized else 0,
        )

    @classmethod
    def of(cls, inputs: SamplingInputs) -> SamplingMode:
        """The mode a step with these rows needs, logprobs aside (the rows do not carry them:
        `of_requests` does, and `runtime.core.builder.with_mode` widens a batch's mode to it)."""
        sampled_rows = inputs.temperature > 0.0
        filtering_rows = sampled_rows & ((inputs.top_k > 0) | (inputs.top_p < 1.0))
        penalties = inputs.penalties
        return cls(
            bool(sampled_rows.any()),
            bool(filtering_rows.any()),
            inputs.masked_ids.shape[1],
            penalty_width=0 if penalties is None else penalties.token_ids.shape[1],
        )


def _most_penalized_tokens(requests: Sequence[SamplingRequest]) -> int:
    """The most distinct prompt and known output tokens of a penalized request of `requests`
    (what its `PenaltyHistory`, caught up with its outputs, holds)."""
    return max(
        (
            r.penalty_history.caught_up(r.output_token_ids).num_columns
            for r in requests
            if r.penalty_history is not None
        ),
        default=0,
    )


class SamplingNeeds(NamedTuple):
    """What one request asks of the sampler whatever its progress (fixed for its life, computed
    once: `SamplingMode.of_requests` reads it for every row of every step).

    Attributes:
      sampled: temperature > 0.
      filtered: sampled with top_k > 0 or top_p < 1.
      logprobs: the `logprobs` it asks for (None: none).
      min_tokens: while it has fewer outputs, its stop ids are masked.
      penalized: some presence, frequency or repetition penalty applies.
    """

    sampled: bool
    filtered: bool
    logprobs: int | None
    min_tokens: int
    penalized: bool = False

    @classmethod
    def of(cls, params: SamplingParams) -> SamplingNeeds:
        """The needs of a request with these `SamplingParams`."""
        sampled = params.temperature > 0.0
        filtered = sampled and (params.top_k > 0 or params.top_p < 1.0)
        return cls(sampled, filtered, params.logprobs, params.min_tokens, params.is_penalized)


class CountedTokens(Protocol):
    """A penalized request's token history as `SamplingMode.of_requests` reads it (a
    `runtime.core.penalties.PenaltyHistory`)."""

    @property
    def num_columns(self) -> int: ...

    def caught_up(self, output_token_ids: list[int]) -> CountedTokens: ...


class SamplingRequest(Protocol):
    """What `SamplingMode.of_requests` reads of a request (a `runtime.core.request.Request`)."""

    @property
    def sampling_needs(self) -> SamplingNeeds: ...

    @property
    def sampling_params(self) -> SamplingParams: ...

    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def penalty_history(self) -> CountedTokens | None: ...


def mask_width(num_masked: int) -> int:
    """Columns of `masked_ids` for a step whose longest mask has `num_masked` ids (0 if none)."""
    if num_masked == 0:
        return 0
    width = MIN_MASK_WIDTH
    while width < num_masked:
        width *= 2
    return width


def penalty_width(num_tokens: int) -> int:
    """Columns of the penalty tables for a step whose most penalized row lists `num_tokens`
    distinct tokens (0 if no row is penalized: a penalized row always has its prompt's)."""
    if num_tokens == 0:
        return 0
    width = MIN_PENALTY_WIDTH
    while width < num_tokens:
        width *= 2
    return width


def top_logprobs_width(k: int) -> int:
    """Top log-probability columns for a step whose largest `logprobs` is k (0 if 0): a power of
    two, so that the k asked do not each compile a variant."""
    width = 0 if k == 0 else 1
    while width < k:
        width *= 2
    return width
