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
     unmeasured, as does a step of the other kind: in a multi-host run a step drafts when any
     process's gate asks, and every gate is asked about the same batch sizes);
  2. a window's rate is the tokens its steps retired over their seconds (host and device,
     compiling excluded: `Engine.step` reports both through `observe`), its first step left
     out: that step still retires the previous window's last asynchronous step, or, after a
     synchronous drafting window, retires nothing (its own tokens come with the next step),
     and a first drafting step has no drafts yet from the head. (With the MTP head drafting
     steps are asynchronous too; a row scheduled on drafts that were then rejected moves back
     on the device, or, when it may not, retires nothing, `RowsInFlight.is_stale`, so the window
     after a drafting one pays for the rows its last step wasted.);
  3. the two kinds are compared only in pairs of adjacent windows (a drafting window next to a
     plain one): the host's speed drifts by tens of percent over seconds on a shared machine,
     so rates measured at different times do not compare. A class's ratio (drafting rate over
     plain rate) is a moving average of its pairs' ratios;
  4. a class measures a pair first, then runs the kind its ratio favours, and runs the other
     kind again after `interval` windows (a check: it and the windows beside it give two more
     pairs), an interval that doubles while the answer stays the same, up to `max_interval`, so
     a choice that stops paying is found within that many windows without checking often.
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
from typing import ClassVar, NamedTuple, Protocol

from runtime.core.config import EngineConfig


class DraftGate(Protocol):
    """Decides, step by step, whether the engine drafts (module docstring).

    `uniform`: whether `drafts` answers from `num_running` alone, so every process's gate gives
    the same answer and a multi-host engine need not agree on it (one collective per step less).
    """

    @property
    def uniform(self) -> bool: ...

    def drafts(self, num_running: int) -> bool:
        """Whether the coming step drafts, when no rank runs more than `num_running` requests."""

    def observe(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        """The step just asked about retired `num_tokens` tokens in `seconds`; `drafted`: whether
        it drafted (every process agrees on that, so another process's gate may have asked for
        it)."""


@dataclasses.dataclass(frozen=True)
class BatchLimit:
    """Drafts while at most `max_batch_size` requests run (0: never)."""

    max_batch_size: int
    uniform: ClassVar[bool] = True

    def drafts(self, num_running: int) -> bool:
        return self.max_batch_size > 0 and num_running <= self.max_batch_size

    def observe(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        """Learns nothing from a step."""


@dataclasses.dataclass
class _Measured:
    """One batch class's measurement: drafting steps' rate over plain steps' (None until a pair
    of windows gave one), and when to measure the losing kind again."""

    ratio: float | None = None
    interval: int = 0
    windows_since_check: int = 0

    @property
    def best(self) -> bool:
        """The kind that gives more tokens per second (drafting on a tie)."""
        return self.ratio is not None and self.ratio >= 1.0


class _Window(NamedTuple):
    """A measured window: its class, kind and rate."""

    batch_class: int
    drafts: bool
    rate: float


class MeasuredGate:
    """Drafts at the batch sizes where measured drafting steps beat plain ones (module
    docstring). `classes`: the batch classes' upper ends (the engine's decode-row buckets).
    Not `uniform`: each process measures its own host."""

    uniform = False

    def __init__(
        self,
        classes: tuple[int, ...],
        *,
        max_batch_size: int | None = None,
        window: int = 16,
        smoothing: float = 0.5,
        first_interval: int = 4,
        max_interval: int = 16,
    ) -> None:
        self.classes = tuple(sorted(classes))
        self.max_batch_size = sys.maxsize if max_batch_size is None else max_batch_size
        self.window, self.smoothing = window, smoothing
        self.first_interval, self.max_interval = first_interval, max_interval
        self.measured: dict[int, _Measured] = {}
        self._class: int | None = None  # the open window's class (None: no window open)
        self._kind = False
        self._steps, self._tokens, self._seconds = 0, 0, 0.0
        self._spoiled = False  # a step of the open window ran the other kind
        self._last: _Window | None = None  # the window just before the open one, if measured

    def drafts(self, num_running: int) -> bool:
        if num_running == 0 or num_running > self.max_batch_size:
            self._class = self._last = None  # the open window, if any, ends unmeasured
            return False
        batch_class = self._class_of(num_running)
        if batch_class != self._class or self._steps == self.window:
            self._close()
            self._open(batch_class)
        self._steps += 1
        return self._kind

    def observe(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        if drafted != self._kind:  # another process's gate chose: the window is not one kind
            self._spoiled = True
        if self._steps > 1:  # a window's first step is not its own (module docstring, 2)
            self._tokens += num_tokens
            self._seconds += seconds

    def chooses(self, num_running: int) -> bool | None:
        """The kind the class of `num_running` runs outside its checks (True: drafting); None
        until a pair of windows measured it."""
        measured = self.measured.get(self._class_of(num_running))
        return None if measured is None or measured.ratio is None else measured.best

    def _class_of(self, num_running: int) -> int:
        i = bisect.bisect_left(self.classes, num_running)
        return self.classes[min(i, len(self.classes) - 1)]

    def _close(self) -> None:
        """A full window next to one of the other kind folds their ratio into its class's (a
        window that retired no decode token, or took no time, measures nothing)."""
        full = self._steps == self.window and not self._spoiled
        if self._class is None or not full or self._tokens == 0 or self._seconds <= 0:
            self._last = None  # e.g. a window of prefill chunks only
            return
        window = _Window(self._class, self._kind, self._tokens / self._seconds)
        last, self._last = self._last, window
        if last is None or last.drafts == window.drafts:  # `_open` drops a last of another class
            return
        drafting, plain = (window, last) if window.drafts else (last, window)
        measured = self.measured[window.batch_class]
        before = measured.best
        ratio = drafting.rate / plain.rate
        old = ratio if measured.ratio is None else measured.ratio
        measured.ratio = old + self.smoothing * (ratio - old)
        if measured.best != before:
            measured.interval = self.first_interval  # the answer changed: check again soon

    def _open(self, batch_class: int) -> None:
        measured = self.measured.setdefault(batch_class, _Measured(interval=self.first_interval))
        if self._last is not None and self._last.batch_class != batch_class:
            self._last = None
        self._class, self._steps, self._tokens, self._seconds = batch_class, 0, 0, 0.0
        self._spoiled = False
        if measured.ratio is None:  # a drafting window, then a plain one next to it
            self._kind = self._last is None or not self._last.drafts
            return
        measured.windows_since_check += 1
        check = measured.windows_since_check > measured.interval
        if check:
            measured.windows_since_check = 0
            measured.interval = min(2 * measured.interval, self.max_interval)
        self._kind = measured.best != check


def draft_gate(config: EngineConfig) -> DraftGate:
    """The gate `config.speculative` asks for (module docstring)."""
    spec = config.speculative
    if spec is None:
        return BatchLimit(0)
    if spec.adaptive:
        return MeasuredGate(config.decode_row_buckets, max_batch_size=spec.max_batch_size)
    return BatchLimit(sys.maxsize if spec.max_batch_size is None else spec.max_batch_size)
