"""`Scheduler`: every policy decision of a step (admission, chunking, preemption), in plain Python.

Continuous batching: each step serves the running requests first (oldest first), then admits
waiting ones while `max_num_seqs`, the token budget and the pools allow. A prefill chunk ends on an
absolute multiple of the model's `chunk_size` unless it ends the tokens to prefill, so a request's
result does not depend on how its prompt was cut (DESIGN.md section 5, invariant 7). When the KV
block pool runs out, the newest running request is preempted: it gives back its blocks and slot and
later recomputes everything it had (prompt + output) as a fresh prefill.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import NamedTuple

from runtime.config import EngineConfig
from runtime.pools import Pool
from runtime.request import FinishReason, Request, RequestStatus


class ScheduledRequest(NamedTuple):
    """One request's share of a step: tokens [start, start + num_tokens) of prompt + output.

    A NamedTuple rather than a frozen dataclass: one is built per running request per step, and a
    frozen dataclass's constructor costs several times more.
    """

    request: Request
    start: int
    num_tokens: int

    @property
    def token_ids(self) -> list[int]:
        return self.request.token_ids(self.start, self.start + self.num_tokens)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The scheduler's decision for one step, classified by meaning: decode rows, prefill rows."""

    decodes: list[ScheduledRequest]
    prefills: list[ScheduledRequest]
    preempted: list[Request]

    @property
    def items(self) -> list[ScheduledRequest]:
        return self.decodes + self.prefills

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.prefills)


class Scheduler:
    """Waiting queue, running list, the block pool and the state-slot pool."""

    def __init__(
        self, config: EngineConfig, chunk_size: int, *, uses_blocks: bool, uses_slots: bool
    ) -> None:
        if config.max_num_batched_tokens < chunk_size:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} must be >= the model's "
                f"chunk_size={chunk_size}, or long prompts could never advance"
            )
        self.config = config
        self.chunk_size = chunk_size
        self.uses_blocks = uses_blocks
        self.uses_slots = uses_slots
        self.block_pool = Pool("KV block", config.num_blocks)
        self.slot_pool = Pool("state slot", config.num_slots)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a waiting or running request now; returns it, or None if it is not here."""
        for request in [*self.waiting, *self.running]:
            if request.request_id == request_id:
                self._finish(request, FinishReason.ABORT)
                return request
        return None

    def schedule(self) -> Schedule:
        """Pick this step's requests and token counts; may preempt running requests."""
        budget = self.config.max_num_batched_tokens
        decodes: list[ScheduledRequest] = []
        prefills: list[ScheduledRequest] = []
        preempted: list[Request] = []
        index = 0
        while index < len(self.running):
            request = self.running[index]
            num_tokens = 1 if request.is_decode else self._chunk_len(request, budget)
            if num_tokens == 0 or num_tokens > budget:
                index += 1
                continue
            needed = self._blocks_needed(request, num_tokens)
            while not self.block_pool.can_allocate(needed):
                preempted.append(self._preempt(self.running[-1]))
                if preempted[-1] is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break  # it was the newest and preempted itself: nothing after it is running
            if needed:
                request.block_ids += self.block_pool.allocate(needed)
            section = decodes if request.is_decode else prefills
            section.append(ScheduledRequest(request, request.num_computed, num_tokens))
            budget -= num_tokens
            index += 1
        if not preempted:
            budget = self._admit(budget, prefills)
        return Schedule(decodes, prefills, preempted)

    def postprocess(self, schedule: Schedule, sampled: list[int]) -> list[Request]:
        """Advance each scheduled request; append a token where its last known token was fed.

        `sampled[i]` is the token sampled from the logits of `schedule.items[i]`'s last token.
        Returns the requests that finished in this step.
        """
        finished = []
        now = time.perf_counter()
        for item, token in zip(schedule.items, sampled, strict=True):
            request = item.request
            request.num_computed += item.num_tokens
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk that is not the last one: its logits are not needed
            request.output_token_ids.append(int(token))
            if request.first_token_time is None:
                request.first_token_time = now
            reason = self._stop_reason(request, int(token))
            if reason is not None:
                self._finish(request, reason)
                finished.append(request)
        return finished

    def _admit(self, budget: int, prefills: list[ScheduledRequest]) -> int:
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            request = self.waiting[0]
            num_tokens = self._chunk_len(request, budget)
            if num_tokens == 0 or not self._can_grow(request, num_tokens):
                break
            if self.uses_slots and not self.slot_pool.can_allocate(1):
                break
            self.waiting.popleft()
            if self.uses_slots:
                request.state_slot = self.slot_pool.allocate(1)[0]
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._grow(request, num_tokens)
            prefills.append(ScheduledRequest(request, request.num_computed, num_tokens))
            budget -= num_tokens
        return budget

    def _chunk_len(self, request: Request, budget: int) -> int:
        """Prefill tokens to feed: all that remain if they fit, else up to a chunk-size multiple."""
        remaining = request.num_prefill_tokens - request.num_computed
        if remaining <= budget:
            return remaining
        end = (request.num_computed + budget) // self.chunk_size * self.chunk_size
        return max(end - request.num_computed, 0)

    def _blocks_needed(self, request: Request, num_tokens: int) -> int:
        if not self.uses_blocks:
            return 0
        total = -(-(request.num_computed + num_tokens) // self.config.block_size)
        needed = total - len(request.block_ids)
        return needed if needed > 0 else 0

    def _can_grow(self, request: Request, num_tokens: int) -> bool:
        return self.block_pool.can_allocate(self._blocks_needed(request, num_tokens))

    def _grow(self, request: Request, num_tokens: int) -> None:
        needed = self._blocks_needed(request, num_tokens)
        if needed:
            request.block_ids += self.block_pool.allocate(needed)

    def _release(self, request: Request) -> None:
        self.block_pool.free(request.block_ids)
        if request.state_slot:
            self.slot_pool.free([request.state_slot])
        request.block_ids, request.state_slot = [], 0

    def _preempt(self, request: Request) -> Request:
        self.running.remove(request)
        self._release(request)
        request.reset_for_recompute()
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        return request

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = time.perf_counter()

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.sampling_params
        if token in params.stop_token_ids:
            return FinishReason.STOP
        if len(request.output_token_ids) >= params.max_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None
