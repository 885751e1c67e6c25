"""`Scheduler`: every policy decision of a step (admission, chunking, preemption), in plain Python.

Continuous batching with chunked prefill under a token budget B (`max_num_batched_tokens`), at
most S = `max_num_seqs` rows per step, chunk size c (the model's `chunk_size`). Each step:

1. Running requests are served oldest first (by arrival). Each running decode gets its one token
   from lanes set aside before any prefill is served, so decodes never wait for prefills.
2. Running prefills share the rest, oldest first. A prefill chunk ends on an absolute multiple of
   c unless it ends the tokens to prefill, so a request's result does not depend on how its
   prompt was cut (DESIGN.md section 5, invariant 7).
3. Waiting requests are admitted oldest first with the tokens left. A request that cannot get a
   chunk of them keeps its place and its row for a later step, and the requests behind it may use
   those tokens (fewer than c, which it could not use): no head-of-line blocking on the budget.
   Running out of rows, state slots or KV blocks stops admission instead, because the requests
   behind would take what the older one is waiting for.
4. When the KV block pool runs out, the youngest running request is preempted: it gives back its
   blocks and slot and later recomputes everything it had (prompt + output) as a fresh prefill.
5. Speculative decoding (`config.speculative`, K drafts at most): after steps 1-3, each decode row,
   oldest first, gets k <= K drafts out of what is left (tokens of the budget, free KV blocks,
   free state slots), never more than its drafter proposes nor than the tokens it may still
   generate minus one, and 1 + k fresh lane slots (the state after each of its tokens). Drafts
   never preempt and never take what a prefill or an admission could use, so the fairness bound
   below is unchanged; k = 0 rows take the same path.

Fairness. B >= c + S - 1 is required (`min_token_budget`): a full chunk always fits beside a full
decode batch (a step with a prefill row has at most S - 1 decode rows). Hence, while rows, slots
and blocks last, the oldest request still prefilling advances by at least k = (B - S + 1) // c
chunks every step, or finishes its prompt: if it runs, no older prefill takes tokens before it and
at most S - 1 lanes are set aside; if it waits, it has a free row and no running prefill is older
than it (a request that overtook it in step 3 had a whole prompt under c tokens, so it finished its
prefill in that step). So a request's first token comes at most sum_j ceil(L_j / (k * c)) steps
after it arrives, over the requests j that arrived no later (itself included; L_j their prompt
lengths); tests/runtime/test_scheduler_fairness.py checks this bound. A request kept out for lack
of rows, slots or blocks waits for running requests to finish or be preempted, and no younger
request is admitted before it meanwhile, so it is not starved either.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from runtime.config import EngineConfig, min_token_budget
from runtime.pools import Pool
from runtime.request import FinishReason, Request, RequestStatus


class ScheduledRequest(NamedTuple):
    """One request's share of a step: tokens [start, start + num_tokens) of prompt + output.

    A NamedTuple rather than a frozen dataclass: one is built per running request per step, and a
    frozen dataclass's constructor costs several times more. A speculative decode row's tokens
    past prompt + output are the request's drafts, and `lane_slots` holds the fresh slot each of
    its num_tokens lanes writes (empty without speculation: the row updates its slot in place).
    """

    request: Request
    start: int
    num_tokens: int
    lane_slots: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        tokens = self.request.token_ids(self.start, self.start + self.num_tokens)
        return tokens + self.request.draft_token_ids[: self.num_tokens - len(tokens)]


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
    """Waiting and running requests (each oldest first), the block pool and the state-slot pool."""

    def __init__(
        self, config: EngineConfig, chunk_size: int, *, uses_blocks: bool, uses_slots: bool
    ) -> None:
        config = config.resolved(chunk_size)
        needed = min_token_budget(chunk_size, config.max_num_seqs)
        if config.max_num_batched_tokens < needed:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} must be >= chunk_size + "
                f"max_num_seqs - 1 = {needed}: one full prefill chunk of the model's "
                f"chunk_size={chunk_size} must fit beside a full decode batch"
            )
        self.config = config
        self.chunk_size = chunk_size
        self.uses_blocks = uses_blocks
        self.uses_slots = uses_slots
        self.block_pool = Pool("KV block", config.num_blocks)
        self.slot_pool = Pool("state slot", config.num_slots)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        spec = config.speculative
        self.num_speculative_tokens = spec.num_speculative_tokens if spec is not None else 0

    @property
    def budget(self) -> int:
        """Tokens per step: live decode lanes + prefill tokens."""
        return self.config.max_num_batched_tokens

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        _insert_by_arrival(self.waiting, request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a waiting or running request now; returns it, or None if it is not here."""
        for request in [*self.waiting, *self.running]:
            if request.request_id == request_id:
                self._finish(request, FinishReason.ABORT)
                return request
        return None

    def schedule(self, num_drafts: Callable[[Request], int] | None = None) -> Schedule:
        """Pick this step's requests and token counts (module docstring, steps 1-5);
        `num_drafts(request)` is how many drafts the drafter proposes for a decode row."""
        decodes: list[ScheduledRequest] = []
        prefills: list[ScheduledRequest] = []
        preempted: list[Request] = []
        prefill_budget = self.budget - sum(1 for r in self.running if r.is_decode)
        for request in list(self.running):  # oldest first
            if request.status is not RequestStatus.RUNNING:
                break  # preempted in this loop, and so is everything younger
            num_tokens = 1 if request.is_decode else self._chunk_len(request, prefill_budget)
            if num_tokens == 0 or not self._reserve_blocks(request, num_tokens, preempted):
                continue
            item = ScheduledRequest(request, request.num_computed, num_tokens)
            if request.is_decode:
                decodes.append(item)  # its lane was set aside in prefill_budget
            else:
                prefills.append(item)
                prefill_budget -= num_tokens
        if not preempted:
            self._admit(prefills, prefill_budget)
        if self.num_speculative_tokens:
            left = self.budget - len(decodes) - sum(item.num_tokens for item in prefills)
            decodes = self._speculate(decodes, left, num_drafts or (lambda _: 0))
        return Schedule(decodes, prefills, preempted)

    def postprocess(
        self, schedule: Schedule, sampled: list[int], drafts: Sequence[list[int]] | None = None
    ) -> list[Request]:
        """Advance each scheduled request; append tokens where its last known token was fed.

        `sampled[i]` is the token sampled from the logits of `schedule.items[i]`'s last token, or
        for a speculative decode row the target's token after the accepted drafts `drafts[i]`:
        the row appends drafts[i] + [sampled[i]], cut at the first stop, and keeps the state of
        its lane len(drafts[i]). Returns the requests that finished in this step.
        """
        finished = []
        now = time.perf_counter()
        for i, (item, token) in enumerate(zip(schedule.items, sampled, strict=True)):
            request = item.request
            accepted = drafts[i] if drafts is not None else []
            if item.lane_slots:
                self._keep_lane(request, item.lane_slots, len(accepted))
                request.num_computed += len(accepted) + 1
                request.draft_token_ids = []
            else:
                request.num_computed += item.num_tokens
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk that is not the last one: its logits are not needed
            if request.first_token_time is None:
                request.first_token_time = now
            for new in (*accepted, token):
                request.output_token_ids.append(int(new))
                reason = self._stop_reason(request, int(new))
                if reason is not None:
                    self._finish(request, reason)
                    finished.append(request)
                    break
        return finished

    def _speculate(
        self, decodes: list[ScheduledRequest], budget: int, num_drafts: Callable[[Request], int]
    ) -> list[ScheduledRequest]:
        """Give each decode row, oldest first, its drafts and lane slots (module docstring, 5)."""
        rows = []
        for i, item in enumerate(decodes):
            request = item.request
            params = request.sampling_params
            room = min(params.max_tokens - len(request.output_token_ids),
                       self.config.max_model_len - request.num_tokens)  # fmt: skip
            k = min(num_drafts(request), self.num_speculative_tokens, room - 1, budget)
            if self.uses_slots:  # keep a lane-0 slot for each younger row
                k = min(k, self.slot_pool.num_free - (len(decodes) - i))
            while k > 0 and not self.block_pool.can_allocate(self._blocks_needed(request, 1 + k)):
                k -= 1
            if k > 0:
                request.block_ids += self.block_pool.allocate(self._blocks_needed(request, 1 + k))
            lanes = self.slot_pool.allocate(1 + k) if self.uses_slots else [0] * (1 + k)
            rows.append(item._replace(num_tokens=1 + k, lane_slots=tuple(lanes)))
            budget -= k
        return rows

    def _keep_lane(self, request: Request, lane_slots: tuple[int, ...], lane: int) -> None:
        """The state after `lane` becomes the request's; its old slot and other lanes go back."""
        if not self.uses_slots:
            return
        old, request.state_slot = request.state_slot, lane_slots[lane]
        self.slot_pool.free([old, *lane_slots[:lane], *lane_slots[lane + 1 :]])

    def _admit(self, prefills: list[ScheduledRequest], budget: int) -> None:
        """Admit waiting requests oldest first (module docstring, step 3)."""
        free_rows = self.config.max_num_seqs - len(self.running)
        for request in list(self.waiting):
            if free_rows == 0 or (self.uses_slots and not self.slot_pool.can_allocate(1)):
                return
            free_rows -= 1  # admitted now, or kept for it while younger requests go ahead
            num_tokens = self._chunk_len(request, budget)
            if num_tokens == 0:
                continue
            num_blocks = self._blocks_needed(request, num_tokens)
            if not self.block_pool.can_allocate(num_blocks):
                return
            self._start(request, num_blocks)
            prefills.append(ScheduledRequest(request, request.num_computed, num_tokens))
            budget -= num_tokens

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

    def _reserve_blocks(self, request: Request, num_tokens: int, preempted: list[Request]) -> bool:
        """Give `request` the KV blocks its next tokens reach, preempting the youngest running
        requests while the pool is short; False if that preempted `request` itself."""
        needed = self._blocks_needed(request, num_tokens)
        while not self.block_pool.can_allocate(needed):
            victim = self.running[-1]
            preempted.append(self._preempt(victim))
            if victim is request:
                return False
        if needed:
            request.block_ids += self.block_pool.allocate(needed)
        return True

    def _start(self, request: Request, num_blocks: int) -> None:
        self.waiting.remove(request)
        if self.uses_slots:
            request.state_slot = self.slot_pool.allocate(1)[0]
        request.block_ids = self.block_pool.allocate(num_blocks)
        request.status = RequestStatus.RUNNING
        _insert_by_arrival(self.running, request)

    def _release(self, request: Request) -> None:
        self.block_pool.free(request.block_ids)
        if request.state_slot:
            self.slot_pool.free([request.state_slot])
        request.block_ids, request.state_slot = [], 0

    def _preempt(self, request: Request) -> Request:
        self.running.remove(request)
        self._release(request)
        request.reset_for_recompute()
        _insert_by_arrival(self.waiting, request)
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
        num_outputs = len(request.output_token_ids)  # `token` included
        if token in request.stop_ids and num_outputs > params.min_tokens:
            return FinishReason.STOP
        if num_outputs >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None


def _insert_by_arrival(queue: list[Request], request: Request) -> None:
    """Keep `queue` oldest first; a request preempted for recompute goes back to its place."""
    bisect.insort(queue, request, key=lambda r: r.arrival_time)
