"""Whether a step drafts: the engine's `DraftGate`, asked before every step (no jax).

A step with drafts verifies 1 + K lanes per decode row and runs synchronously (its rows' last
tokens must be on the host to propose); one without runs one lane per row, asynchronously when
the engine schedules so. Which gives more tokens per second depends on the model, the batch and
how often drafts are accepted, so the gate is a policy of its own, always present:

- `BatchLimit`: draft while no rank runs more than `max_batch_size` requests (never without
  speculation; always for a draft model, which must follow every step of the target).
- `MeasuredGate` (`SpeculativeConfig.adaptive`): measure both kinds of step at each batch size
  and draft where drafting wins:

  1. steps come in windows of `window` consecutive steps of one kind, per batch class (the
     decode-row bucket that holds the running requests; a change of class ends the window,
     unmeasured);
  2. a window's rate is the tokens its steps retired over their seconds (host and device,
     compiling excluded: `Engine.step` reports both through `observe`), its first step left
     out: that step still retires the previous window's last asynchronous step, or, after a
     drafting window, retires nothing (its own tokens come with the next step), and a first
     drafting step has no drafts yet from the head;
  3. a class measures each kind once, then runs the kind with the higher rate (each kind's rate
     a moving average over its windows), and measures the other kind again after `interval`
     windows, an interval that doubles while the answer stays the same (up to `max_interval`),
     so a choice that stops paying is found without paying for the check often.
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
from typing import Protocol

from runtime.core.config import EngineConfig


class DraftGate(Protocol):
    """Decides, step by step, whether the engine drafts (module docstring)."""

    def drafts(self, num_running: int) -> bool:
        """Whether the coming step drafts, when no rank runs more than `num_running` requests."""

    def observe(self, num_tokens: int, seconds: float) -> None:
        """The step just asked about retired `num_tokens` tokens in `seconds`."""


@dataclasses.dataclass(frozen=True)
class BatchLimit:
    """Drafts while at most `max_batch_size` requests run (0: never)."""

    max_batch_size: int

    def drafts(self, num_running: int) -> bool:
        return self.max_batch_size > 0 and num_running <= self.max_batch_size

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learns nothing from a step."""


@dataclasses.dataclass
class _Rates:
    """One batch class's measurements: tokens/s per kind (True: drafting), and when to measure
    the losing kind again."""

    rate: dict[bool, float] = dataclasses.field(default_factory=dict)
    interval: int = 0
    windows_since_check: int = 0


class MeasuredGate:
    """Drafts at the batch sizes where measured drafting steps beat plain ones (module
    docstring). `classes`: the batch classes' upper ends (the engine's decode-row buckets)."""

    def __init__(
        self,
        classes: tuple[int, ...],
        *,
        max_batch_size: int | None = None,
        window: int = 16,
        smoothing: float = 0.5,
        first_interval: int = 4,
        max_interval: int = 64,
    ) -> None:
        self.classes = tuple(sorted(classes))
        self.max_batch_size = sys.maxsize if max_batch_size is None else max_batch_size
        self.window, self.smoothing = window, smoothing
        self.first_interval, self.max_interval = first_interval, max_interval
        self.rates: dict[int, _Rates] = {}
        self._class: int | None = None  # the open window's class (None: no window open)
        self._kind = False
        self._steps, self._tokens, self._seconds = 0, 0, 0.0

    def drafts(self, num_running: int) -> bool:
        if num_running == 0 or num_running > self.max_batch_size:
            self._class = None  # the open window, if any, ends unmeasured
            return False
        batch_class = self._class_of(num_running)
        if batch_class != self._class or self._steps == self.window:
            self._close()
            self._open(batch_class)
        self._steps += 1
        return self._kind

    def observe(self, num_tokens: int, seconds: float) -> None:
        if self._steps > 1:  # a window's first step is not its own (module docstring, 2)
            self._tokens += num_tokens
            self._seconds += seconds

    def chooses(self, num_running: int) -> bool | None:
        """The kind the class of `num_running` runs outside its checks (True: drafting); None
        until it has measured both."""
        rates = self.rates.get(self._class_of(num_running))
        return None if rates is None or len(rates.rate) < 2 else _best(rates)

    def _class_of(self, num_running: int) -> int:
        i = bisect.bisect_left(self.classes, num_running)
        return self.classes[min(i, len(self.classes) - 1)]

    def _close(self) -> None:
        """Fold a full window's rate into its class's average of that kind."""
        if self._class is None or self._steps < self.window or self._seconds <= 0:
            return
        rates = self.rates[self._class]
        before = _best(rates) if len(rates.rate) == 2 else None
        measured = self._tokens / self._seconds
        old = rates.rate.get(self._kind, measured)
        rates.rate[self._kind] = old + self.smoothing * (measured - old)
        if before is not None and _best(rates) != before:
            rates.interval = self.first_interval  # the answer changed: check again soon

    def _open(self, batch_class: int) -> None:
        rates = self.rates.setdefault(batch_class, _Rates(interval=self.first_interval))
        self._class, self._steps, self._tokens, self._seconds = batch_class, 0, 0, 0.0
        unmeasured = [kind for kind in (True, False) if kind not in rates.rate]
        if unmeasured:
            self._kind = unmeasured[0]
            return
        rates.windows_since_check += 1
        check = rates.windows_since_check > rates.interval
        if check:
            rates.windows_since_check = 0
            rates.interval = min(2 * rates.interval, self.max_interval)
        self._kind = _best(rates) != check


def _best(rates: _Rates) -> bool:
    """The kind with the higher rate (drafting on a tie)."""
    return rates.rate[True] >= rates.rate[False]


def draft_gate(config: EngineConfig) -> DraftGate:
    """The gate `config.speculative` asks for (module docstring)."""
    spec = config.speculative
    if spec is None:
        return BatchLimit(0)
    if spec.adaptive:
        return MeasuredGate(config.decode_row_buckets, max_batch_size=spec.max_batch_size)
    return BatchLimit(sys.maxsize if spec.max_batch_size is None else spec.max_batch_size)
