"""`Request`: one generation request and its host-side bookkeeping (no jax)."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from runtime.core import checks
from runtime.core.penalties import PenaltyHistory
from runtime.core.sampling_inputs import SamplingNeeds
from runtime.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from runtime.core.token_grammar import TokenGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; holds no blocks or slot (new, or preempted for recompute)
    RUNNING = "running"  # holds its blocks and state slot
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # generated a stop token
    LENGTH = "length"  # reached max_tokens or max_model_len
    ABORT = "abort"


@dataclasses.dataclass(eq=False)  # identity: two requests are never 'equal'
class Request:
    """A request: its tokens, its progress and the pool entries it holds.

    `num_computed` counts tokens whose effect is in the request's state (and KV blocks). The
    request is a *prefill* while `num_computed < num_prefill_tokens` (its prompt, or after a
    preemption every token it had) and a *decode* afterwards, when exactly one token (the last
    sampled one) is left to feed. `stop_ids` are the tokens that end it: its sampling params'
    stop_token_ids and, unless they ignore EOS, the model's `eos_token_ids`. `logprobs` holds, per
    output token, {token id: log-probability} of the sampled and the top-k tokens when the
    sampling params ask for them (else None).

    `num_cached_tokens` counts the prompt tokens its last admission took from the prefix cache (0
    without caching); what the cache keeps per request lives in the cache's slot planner
    (`runtime.prefix_cache.CachingSlots`), not here.

    `sampling_row` holds the builder's fixed per-row sampling values (`sampling_row`) and
    `sampling_needs` what the request asks of the sampler, both computed once instead of read
    from the sampling params at every step. `penalty_history` (only with presence, frequency or
    repetition penalties; else None) lists its prompt's distinct tokens and counts its outputs
    (`runtime.core.penalties`). `grammar` (only with `SamplingParams.structured`; else None) is
    its matcher, which fills its rows of each step's allowed-token bitmask; the engine's output
    processor sets it when the request arrives (`runtime.structured`).

    Asynchronous scheduling (`EngineArgs.async_scheduling`): `num_pending` counts outputs a
    dispatched step gives that the host has not seen yet (1, or 1 + k for a row with k drafts,
    counted as if all are accepted: `Scheduler.advance`); `pending_row` is the logits row of
    that step which holds the last of them (the next step's decode row takes it from there on
    the device). `num_computed <= num_tokens + num_pending` always; `num_sampled` counts outputs
    known or pending (the index of the next output: its sampling counter).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    eos_token_ids: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = dataclasses.field(init=False, default=())
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed: int = 0
    num_prefill_tokens: int = 0
    block_ids: list[int] = dataclasses.field(default_factory=list)
    state_slot: int = 0
    num_cached_tokens: int = 0
    num_pending: int = 0
    pending_row: int = 0
    num_preemptions: int = 0
    arrival_time: float = dataclasses.field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    logprobs: list[dict[int, float]] | None = None
    sampling_row: SamplingRow[float] = dataclasses.field(init=False, repr=False)
    sampling_needs: SamplingNeeds = dataclasses.field(init=False, repr=False)
    penalty_history: PenaltyHistory | None = dataclasses.field(init=False, repr=False, default=None)
    grammar: TokenGrammar | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.num_prefill_tokens = len(self.prompt_token_ids)
        params = self.sampling_params
        self.sampling_row = sampling_row(params, self.seed)
        self.sampling_needs = SamplingNeeds.of(params)
        if params.is_penalized:
            self.penalty_history = PenaltyHistory(self.prompt_token_ids, params)
        eos = () if params.ignore_eos else self.eos_token_ids
        self.stop_ids = tuple(dict.fromkeys((*params.stop_token_ids, *eos)))
        if params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    def __repr__(self) -> str:
        where = f", slot={self.state_slot}" if self.state_slot else ""
        if self.block_ids:
            where += f", blocks={_short_list(self.block_ids)}"
        return (
            f"Request({self.request_id!r}, {self.status.value}, "
            f"prompt={len(self.prompt_token_ids)}, "
            f"output={len(self.output_token_ids)}/{self.sampling_params.max_tokens}, "
            f"computed={self.num_computed}{where}"
            f"{f', finish={self.finish_reason.value}' if self.finish_reason else ''})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_sampled(self) -> int:
        """Outputs generated, the pending one included."""
        return len(self.output_token_ids) + self.num_pending

    @property
    def num_tokens_left(self) -> int:
        """Tokens still to compute: prefill tokens not yet fed plus outputs not yet generated."""
        unfed = max(self.num_prefill_tokens - self.num_computed, 0)
        return unfed + self.sampling_params.max_tokens - self.num_sampled

    @property
    def is_decode(self) -> bool:
        return self.num_computed >= self.num_prefill_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def masked_token_ids(self) -> tuple[int, ...]:
        """Tokens the next sample may not be: the stop ids until `min_tokens` are generated."""
        if self.num_sampled < self.sampling_params.min_tokens:
            return self.stop_ids
        return ()

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + output."""
        num_prompt = len(self.prompt_token_ids)
        head = self.prompt_token_ids[start:stop]
        tail = self.output_token_ids[max(start - num_prompt, 0) : max(stop - num_prompt, 0)]
        return head + tail

    def token_at(self, index: int) -> int:
        """Token `index` of prompt + output."""
        num_prompt = len(self.prompt_token_ids)
        if index < num_prompt:
            return self.prompt_token_ids[index]
        return self.output_token_ids[index - num_prompt]

    def reset_for_recompute(self) -> None:
        """Forget all progress: the next prefill recomputes every token it has (prompt + output).

        Pending tokens stay pending: they are appended when their steps retire, and the request
        is re-admitted only after that (`Scheduler._admit`), its recompute then covering them
        too."""
        self.num_computed = 0
        self.num_prefill_tokens = self.num_tokens
        self.block_ids = []
        self.state_slot = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions += 1


def checked_request(
    prompt_token_ids: Sequence[int],
    sampling_params: SamplingParams | None,
    *,
    vocab_size: int,
    max_model_len: int,
) -> tuple[list[int], SamplingParams]:
    """(prompt as a list of ints, sampling params); ValueError naming what is wrong.

    The prompt needs 1 to max_model_len - 1 int ids inside the vocabulary (prompt + output
    never exceeds max_model_len); stop ids must be inside the vocabulary too.
    """
    params = SamplingParams() if sampling_params is None else sampling_params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params={params!r} must be a SamplingParams")
    prompt = checks.token_ids("prompt_token_ids", prompt_token_ids, vocab_size)
    checks.token_ids("stop_token_ids", params.stop_token_ids, vocab_size)
    if not prompt:
        raise ValueError("prompt_token_ids is empty: a prompt needs at least one token")
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"prompt has {len(prompt)} tokens: with max_model_len={max_model_len} it leaves no "
            f"room to generate (prompt + output <= max_model_len, so at most {max_model_len - 1})"
        )
    return prompt, params


class SamplingRow[T](NamedTuple):
    """A request's sampling values the builder writes into its rows every step, fixed for its
    life: `SamplingRow[float]` for one request (all exact in float64), `SamplingRow[np.ndarray]`
    for the columns of a table of them (`SamplingRow(*table.T)`). `penalized` (1 or 0) picks the
    rows whose penalty history the builder reads."""

    temperature: T
    top_k: T
    top_p: T
    seed: T
    min_tokens: T
    penalized: T


def sampling_row(params: SamplingParams, seed: int) -> SamplingRow[float]:
    """The `SamplingRow` of a request of `params` and `seed`."""
    return SamplingRow(
        temperature=params.temperature,
        top_k=float(params.top_k),
        top_p=params.top_p,
        seed=float(seed),
        min_tokens=float(params.min_tokens),
        penalized=float(params.is_penalized),
    )


def _short_list(ids: list[int], limit: int = 6) -> str:
    if len(ids) <= limit:
        return str(ids)
    return f"[{', '.join(map(str, ids[: limit - 1]))}, ... {ids[-1]}] ({len(ids)})"
