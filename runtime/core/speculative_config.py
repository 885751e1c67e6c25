"""`SpeculativeConfig`: how drafts are proposed, and the state slots speculation needs (no jax).

Vocabulary only: the drafters that read it live in the speculative wing (`runtime/speculative/`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runtime.core import checks

METHODS = ("ngram", "draft_model", "mtp")
MAX_SPECULATIVE_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed.

    Attributes:
      method: "ngram" (prompt lookup in the request's own prompt + output), "draft_model" (a
        smaller model with the target's vocabulary proposes greedily) or "mtp" (the model's own
        multi-token-prediction head drafts inside the step, `jmamba.mtp`).
      num_speculative_tokens: K, the most drafts per request per step (1..16); decode rows with
        drafts are 1 + K lanes wide.
      prompt_lookup_min / prompt_lookup_max: ngram only: the n-gram lengths tried, longest first;
        the tokens after the most recent earlier occurrence of the request's last n tokens are
        proposed.
      draft_model: draft_model only: a checkpoint directory or a preset name ("tiny-mamba2"); None
        when the engine is given the draft model object itself (`Engine(..., draft_model=m)`).
      max_batch_size: ngram and mtp only: draft only in steps scheduled while no rank holds more
        than this many running requests; larger steps run without drafts, and asynchronously
        when the engine's `async_scheduling` is on (a step with ngram drafts runs synchronously:
        its rows' last tokens must be on the host; one with mtp drafts asynchronously too,
        `drafts_on_device`). None: draft in every step.
      adaptive: ngram and mtp only: measure the tokens per second of steps with and without
        drafts at each batch size, and draft where drafting gives more
        (`runtime.speculative.gate.MeasuredGate`; never above `max_batch_size` when it is set).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    draft_model: str | None = None
    max_batch_size: int | None = None
    adaptive: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method={self.method!r} must be one of {METHODS}")
        checks.integer(
            "num_speculative_tokens",
            self.num_speculative_tokens,
            low=1,
            high=MAX_SPECULATIVE_TOKENS,
        )
        low = checks.integer("prompt_lookup_min", self.prompt_lookup_min, low=1)
        checks.integer("prompt_lookup_max", self.prompt_lookup_max, low=low)
        if self.draft_model is not None and not isinstance(self.draft_model, str):
            raise ValueError(f"draft_model={self.draft_model!r} must be a path or preset name")
        if self.draft_model is not None and self.method != "draft_model":
            raise ValueError(f"draft_model={self.draft_model!r} needs method='draft_model'")
        if self.max_batch_size is not None:
            checks.integer("max_batch_size", self.max_batch_size, low=1)
        checks.flag("adaptive", self.adaptive)
        if self.drafts_selectively and self.method == "draft_model":
            option = "adaptive=True" if self.adaptive else f"max_batch_size={self.max_batch_size}"
            raise ValueError(
                f"{option} needs method 'ngram' or 'mtp': a draft model follows every step of "
                "the target, so it cannot skip steps"
            )

    @property
    def drafts_selectively(self) -> bool:
        """Whether some steps run without drafts (`max_batch_size`, `adaptive`)."""
        return self.max_batch_size is not None or self.adaptive

    @classmethod
    def of(cls, value: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
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
    def has_asynchronous_steps(self) -> bool:
        """Whether an asynchronous engine runs some of its steps asynchronously: those without
        drafts (`drafts_selectively`), or all of them (`drafts_on_device`)."""
        return self.drafts_selectively or self.drafts_on_device

    @property
    def drafts_on_device(self) -> bool:
        """Whether drafts come out of the target's own steps (the MTP head), so that a drafting
        step may run asynchronously: the next step takes them from the device before the host
        has seen them (`runtime.speculative.mtp`). Other drafters propose from tokens the host
        must have, so their drafting steps run synchronously."""
        return self.method == "mtp"

    @property
    def width(self) -> int:
        """Lanes of a decode row with drafts: the last sampled token and K drafts."""
        return 1 + self.num_speculative_tokens


def default_num_slots(max_num_seqs: int, speculative: SpeculativeConfig | None) -> int:
    """State slots per rank, NULL included: one per request, and with speculation 1 + K fresh
    lane slots per decode row held during a step."""
    per_request = 1 if speculative is None else 1 + speculative.width
    return 1 + max_num_seqs * per_request


def chained_lane_slots(
    max_num_seqs: int, speculative: SpeculativeConfig | None, async_scheduling: bool
) -> int:
    """Lane slots the default pool adds when drafting steps chain (asynchronous, drafts on the
    device): a request then holds the lanes of its step in flight, unverified, while the next
    step gives it 1 + K more. Without them the second row's drafts would be trimmed to the
    slots left (`Scheduler`, step 5)."""
    if speculative is None or not (async_scheduling and speculative.drafts_on_device):
        return 0
    return max_num_seqs * speculative.width


def min_num_slots(max_num_seqs: int, speculative: SpeculativeConfig | None) -> int:
    """The fewest slots, NULL included: 2 without speculation (admission waits for a free slot);
    with it, two per request: a decode row with k drafts takes 1 + k fresh slots for its lanes
    during a step, and drafts are trimmed to the slots left."""
    return 2 if speculative is None else 1 + 2 * max_num_seqs
