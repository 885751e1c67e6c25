"""Speculative decoding: its config, the drafter contract, and the acceptance bookkeeping (no jax).

A decode row of a speculative engine carries 1 + k tokens: the request's last sampled token and
k <= K drafts (k varies per request and step; 0 is allowed and runs the same path). Lane t writes
the state after its token to its own fresh slot (`ScheduledRequest.lane_slots`); the sampler
returns, per lane, the target's token and whether it equals the next lane's draft. The host keeps
the longest accepted prefix d_1..d_a and the target's token after it (a + 1 new tokens), makes the
slot of lane a the request's state slot and frees the others (`Scheduler.postprocess`): rollback
by slot choice, no state copy. Attention KV of rejected positions is simply overwritten later.

Drafters (`Drafter`): `runtime.ngram.NgramDrafter` (prompt lookup on the host) and
`runtime.draft_model.DraftModelDrafter` (a smaller jmamba model with its own caches and slots).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import numpy as np

from runtime import checks

if TYPE_CHECKING:
    from runtime.buckets import Bucket
    from runtime.config import EngineConfig
    from runtime.model_runner import ModelRunner
    from runtime.request import Request
    from runtime.scheduler import Schedule

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed.

    Attributes:
      method: "ngram" (prompt lookup in the request's own prompt + output) or "draft_model" (a
        smaller model with the target's vocabulary proposes greedily).
      num_speculative_tokens: K, the most drafts per request per step (1..16); decode rows of
        the step are 1 + K lanes wide.
      prompt_lookup_min / prompt_lookup_max: ngram only: the n-gram lengths tried, longest first;
        the tokens after the most recent earlier occurrence of the request's last n tokens are
        proposed.
      draft_model: draft_model only: a checkpoint directory or a preset name ("tiny-mamba2"); None
        when the engine is given the draft model object itself (`Engine(..., draft_model=m)`).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method={self.method!r} must be one of {METHODS}")
        checks.integer("num_speculative_tokens", self.num_speculative_tokens, low=1,
                       high=MAX_SPECULATIVE_TOKENS)  # fmt: skip
        low = checks.integer("prompt_lookup_min", self.prompt_lookup_min, low=1)
        checks.integer("prompt_lookup_max", self.prompt_lookup_max, low=low)
        if self.draft_model is not None and not isinstance(self.draft_model, str):
            raise ValueError(f"draft_model={self.draft_model!r} must be a path or preset name")
        if self.draft_model is not None and self.method != "draft_model":
            raise ValueError(f"draft_model={self.draft_model!r} needs method='draft_model'")

    @classmethod
    def of(cls, value: SpeculativeConfig | dict | None) -> SpeculativeConfig | None:
        """A config from itself, a dict of its fields (as LLM / CLI options give it), or None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative={value!r} must be a SpeculativeConfig, a dict or None")
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown speculative options {unknown}")
        return cls(**value)

    @property
    def width(self) -> int:
        """Lanes of a decode row: the last sampled token and K drafts."""
        return 1 + self.num_speculative_tokens


class Drafter(Protocol):
    """Proposes drafts for decode rows. The engine calls, each step: `num_wanted` (inside the
    scheduler, per decode row), `propose` (after the ranks agreed on the bucket: every decode
    item gets exactly `num_tokens - 1` drafts in `request.draft_token_ids`), `release_done`
    (after postprocess and abort: give back what finished or preempted requests held)."""

    def num_wanted(self, request: Request) -> int: ...

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> None: ...

    def release_done(self) -> None: ...

    def warmup(self) -> None: ...


@dataclasses.dataclass
class SpeculationStats:
    """Acceptance counters of one data-parallel rank.

    Attributes:
      num_rows: decode rows verified (rows with zero drafts included).
      num_drafted: drafts verified.
      num_accepted: drafts accepted (counted before a stop token cuts the new tokens).
    """

    num_rows: int = 0
    num_drafted: int = 0
    num_accepted: int = 0

    def add(self, other: SpeculationStats) -> SpeculationStats:
        return SpeculationStats(self.num_rows + other.num_rows,
                                self.num_drafted + other.num_drafted,
                                self.num_accepted + other.num_accepted)  # fmt: skip

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted drafts (0 when none were drafted)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a decode row gains per step: 1 + accepted drafts per row (1 without rows)."""
        return 1.0 + (self.num_accepted / self.num_rows if self.num_rows else 0.0)


def make_drafter(
    config: EngineConfig, model: object, num_ranks: int, draft_model: object = None,
    draft_runner: ModelRunner | None = None,
) -> Drafter | None:  # fmt: skip
    """The drafter `config.speculative` asks for (None without speculation). For "draft_model",
    `draft_model` is the draft model (default: loaded from `config.speculative.draft_model`) and
    `draft_runner` may share another engine's compiled draft steps and caches."""
    spec = config.speculative
    if spec is None or spec.method == "ngram":
        if draft_model is not None or draft_runner is not None:
            raise ValueError("draft_model / draft_runner need speculative method 'draft_model'")
        from runtime.ngram import NgramDrafter

        return None if spec is None else NgramDrafter(spec)
    from runtime.draft_model import DraftModelDrafter, check_draft_model

    if draft_model is None:
        if spec.draft_model is None:
            raise ValueError("speculative method 'draft_model' needs draft_model: a checkpoint "
                             "directory or preset name, or the model object")  # fmt: skip
        from runtime.llm import load_model

        draft_model, _ = load_model(spec.draft_model, seed=config.seed)
    check_draft_model(draft_model, model)
    return DraftModelDrafter(draft_model, config, model.config.chunk_size, num_ranks,
                             runner=draft_runner)  # fmt: skip


def verified_tokens(
    schedule: Schedule, sample_rows: np.ndarray, width: int, tokens: np.ndarray,
    accepted: np.ndarray,
) -> tuple[list[int], list[list[int]], SpeculationStats]:  # fmt: skip
    """Split one rank's sampled lanes into what `Scheduler.postprocess` appends.

    Args:
      schedule: the rank's schedule (decode items first; each has num_tokens - 1 drafts).
      sample_rows: [items] each item's last live logits row (`StepBatch.sample_rows`).
      width: W, lanes per decode row.
      tokens / accepted: [N] per logits row, the target's token and whether it equals the draft
        the next lane fed.
    Returns:
      (sampled, drafts, stats): per item the target's token after the accepted drafts, and the
      accepted drafts themselves (empty for prefill items); the step's acceptance counters.
    """
    num_decodes = len(schedule.decodes)
    sampled = tokens[sample_rows].tolist()
    drafts: list[list[int]] = [[] for _ in sample_rows]
    if num_decodes == 0:
        return sampled, drafts, SpeculationStats()
    num_drafts = np.array([item.num_tokens - 1 for item in schedule.decodes])
    flags = accepted[: num_decodes * width].reshape(num_decodes, width).astype(bool)
    flags &= np.arange(width)[None, :] < num_drafts[:, None]
    num_accepted = np.cumprod(flags, axis=1).sum(axis=1)  # the longest accepted prefix
    lane_tokens = tokens[: num_decodes * width].reshape(num_decodes, width)
    for i, a in enumerate(num_accepted.tolist()):
        drafts[i] = lane_tokens[i, :a].tolist()  # == the drafts d_1..d_a
        sampled[i] = int(lane_tokens[i, a])
    stats = SpeculationStats(num_decodes, int(num_drafts.sum()), int(num_accepted.sum()))
    return sampled, drafts, stats


def default_num_slots(max_num_seqs: int, speculative: SpeculativeConfig | None) -> int:
    """State slots per rank, NULL included: one per request, and with speculation 1 + K fresh
    lane slots per decode row held during a step."""
    per_request = 1 if speculative is None else 1 + speculative.width
    return 1 + max_num_seqs * per_request


def min_num_slots(max_num_seqs: int, speculative: SpeculativeConfig | None) -> int:
    """The fewest slots, NULL included: 2 without speculation (admission waits for a free slot);
    with it, one per request and one fresh lane-0 slot per decode row, so that every running
    request can always decode (drafts are trimmed to the slots left)."""
    return 2 if speculative is None else 1 + 2 * max_num_seqs
