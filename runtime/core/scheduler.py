"""`Scheduler`: every policy decision of a step (admission, chunking, preemption, draft budgets),
in plain Python.

Continuous batching with chunked prefill under a token budget B (`max_num_batched_tokens`), at
most S = `max_num_seqs` rows per step, alignment a: the model's `chunk_size` c, or the
`state_block_size` when prefix caching runs in "align" mode. Each step:

1. Running requests are served oldest first (by arrival). Each running decode gets its one token
   from lanes set aside before any prefill is served, so decodes never wait for prefills.
2. Running prefills share the rest, oldest first. A prefill chunk ends on an absolute multiple of
   a unless it ends the tokens to prefill, so a request's result does not depend on how its
   prompt was cut (docs/architecture.md section 5, invariant 7; a is a multiple of c). In
   "align" mode a chunk also stops at the last multiple of a in the prompt: the tail after it is
   a chunk of its own, so the state at that boundary is a chunk end and gets cached
   (`EngineConfig.ends_chunk_at_last_boundary`).
3. Waiting requests are admitted oldest first with the tokens left. Each first asks the slot
   planner for its longest cached prefix (none without prefix caching) and starts after it. A
   request that cannot get a chunk of the tokens left keeps its place and its row for a later
   step, and the requests behind it may use those tokens (fewer than a, which it could not use):
   no head-of-line blocking on the budget. Running out of rows, state slots or KV blocks stops
   admission instead, because the requests behind would take what the older one is waiting for.
4. When the KV block pool runs out (after evicting unused cached blocks), the youngest running
   request is preempted: it gives back its blocks and slots and later recomputes everything it
   had (prompt + output) as a fresh prefill, from its longest cached prefix.
5. Drafts (speculative decoding, K = `config.num_speculative_tokens` at most; K = 0 without it):
   after steps 1-3, each decode row, oldest first, gets k <= K drafts out of what is left (tokens
   of the budget, free KV blocks, free state slots less what the prefix cache's state budget may
   still take), never more than its drafter proposes (`num_drafts`) nor than the tokens it may
   still generate minus one. A row with k > 0 drafts gets 1 + k fresh lane slots (the state after
   each of its tokens; verification keeps one); a row with none is a plain one-token decode row.
   Drafts never preempt and never take what a prefill or an admission could use, so the fairness
   bound below is unchanged.

Fairness. B >= a + S - 1 is required (`min_token_budget`): a full aligned chunk always fits beside a
full decode batch (a step with a prefill row has at most S - 1 decode rows). Hence, while rows,
slots and blocks last, the oldest request still prefilling advances by at least k = (B - S + 1) // a
aligned chunks every step, or finishes its prompt (in "align" mode: or reaches the last multiple of
a in its prompt, after which its tail of fewer than a tokens takes one step): if it runs, no older
prefill takes tokens before it and at most S - 1 lanes are set aside; if it waits, it has a free row
and no running prefill is older than it (a request that overtook it in step 3 had fewer than a
tokens left to prefill, so it finished its prefill in that step). So a request's first token comes
at most sum_j ceil(L_j / (k * a)) steps after it arrives, plus one step per request in "align" mode,
over the requests j that arrived no later (itself included; L_j their prompt lengths); a prefix hit
only shortens L_j. tests/runtime/core/test_scheduler_fairness.py checks this bound. A request kept
out for lack of rows, slots or blocks waits for running requests to finish or be preempted, and no
younger request is admitted before it meanwhile, so it is not starved either.

Which slot each row reads and writes, which cached prefix a request starts after and what a step
publishes to the prefix cache are the slot planner's (`runtime/core/slots.py`; with caching on,
`runtime/prefix_cache/slots.py`); which rows scheduled on unverified drafts move back or are
dropped is `runtime/core/in_flight.py`; the schedule itself is `runtime/core/schedule.py`; when a
request stops is `runtime/core/stopping.py`.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

import numpy as np

from runtime.core import stopping
from runtime.core.config import EngineConfig
from runtime.core.in_flight import RowsInFlight
from runtime.core.request import FinishReason, Request, RequestStatus
from runtime.core.schedule import Schedule, ScheduledRequest
from runtime.core.slots import SlotPlanner


def no_drafts(request: Request) -> int:
    """The draft count of an engine without speculative decoding."""
    return 0


class Scheduler:
    """Waiting and running requests (each oldest first) of one rank, and its slot planner (which
    keeps the rank's KV block and state-slot pools)."""

    def __init__(self, config: EngineConfig, slots: SlotPlanner) -> None:
        """`config`: the engine's, as `slots` was built from it."""
        self.config = config
        self.chunk_size = config.chunk_size
        self.alignment = config.prefill_alignment
        self.slots = slots
        self.block_pool, self.slot_pool = slots.block_pool, slots.slot_pool
        self.uses_blocks, self.uses_slots = slots.uses_blocks, slots.uses_slots
        self.max_drafts = config.num_speculative_tokens
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.in_flight = RowsInFlight(slots)  # rows scheduled on drafts not verified yet

    @property
    def budget(self) -> int:
        """Tokens per step: live decode lanes + prefill tokens."""
        return self.config.max_num_batched_tokens

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def decodes_only(self) -> bool:
        """Whether the next schedule holds decode rows alone: nothing waits and every running
        request is past its prompt (`Engine` chains such steps into one program)."""
        running = self.running
        return not self.waiting and all(r.num_computed >= r.num_prefill_tokens for r in running)

    def add(self, request: Request) -> None:
        _insert_by_arrival(self.waiting, request)

    def enter_computed(self, request: Request, num_blocks: int) -> bool:
        """Enter a request whose first `request.num_computed` tokens were computed elsewhere (a
        prefill instance's hand-over, `runtime.disagg`) as running, with its own state slot and
        `num_blocks` fresh KV blocks for the caller to fill. False, taking nothing, when a row,
        the slot or the blocks are short (the caller retries later)."""
        free = len(self.running) < self.config.max_num_seqs and self.slots.can_start()
        if not free or not self.slots.can_allocate_blocks(num_blocks):
            return False
        self.slots.start(request)
        request.block_ids = self.slots.allocate_blocks(num_blocks)
        request.status = RequestStatus.RUNNING
        _insert_by_arrival(self.running, request)
        return True

    def abort(self, request_id: str) -> Request | None:
        """Finish a waiting or running request now; returns it, or None if it is not here."""
        for request in [*self.waiting, *self.running]:
            if request.request_id == request_id:
                self._finish(request, FinishReason.ABORT)
                return request
        return None

    def schedule(self, num_drafts: Callable[[Request], int] = no_drafts) -> Schedule:
        """Pick this step's requests and token counts (module docstring, steps 1-5);
        `num_drafts(request)` is how many drafts the drafter proposes for a decode row."""
        decoding: list[Request] = []  # running decodes that got their token, oldest first
        prefills: list[ScheduledRequest] = []
        preempted: list[Request] = []
        running, block_size = self.running, self.config.block_size
        num_decodes = sum([r.num_computed >= r.num_prefill_tokens for r in running])
        prefill_budget = self.budget - num_decodes
        for request in list(running):  # oldest first
            if request.status is not RequestStatus.RUNNING:
                break  # preempted in this loop, and so is everything younger
            if request.num_computed >= request.num_prefill_tokens:  # a decode: one token
                if request.num_pending and stopping.ends_with_pending(request, self.config):
                    continue  # its pending token is its last: it finishes when that retires
                if request.num_pending and request.grammar is not None:
                    continue  # its grammar's next mask needs the pending token on the host
                # Only a token that starts a new KV block needs one (every block_size steps).
                needs_block = self.uses_blocks and request.num_computed >= (
                    len(request.block_ids) * block_size
                )
                if not needs_block or self._reserve_blocks(request, 1, preempted):
                    decoding.append(request)  # its lane was set aside in prefill_budget
                continue
            num_tokens = self._chunk_len(request, prefill_budget)
            if num_tokens == 0 or not self._reserve_blocks(request, num_tokens, preempted):
                continue
            prefills.append(ScheduledRequest(request, request.num_computed, num_tokens))
            prefill_budget -= num_tokens
        if not preempted:
            self._admit(prefills, prefill_budget)
        left = self.budget - len(decoding) - sum(item.num_tokens for item in prefills)
        decodes = self._decode_rows(decoding, left, num_drafts)
        prefills = [self.slots.prefill_row(item) for item in prefills]
        return Schedule(decodes, prefills, preempted)

    def postprocess(
        self, schedule: Schedule, sampled: list[int], drafts: Sequence[list[int]] = ()
    ) -> list[Request]:
        """After a step ran: `advance`, then `retire` (a synchronous engine step)."""
        self.advance(schedule)
        return self.retire(schedule, sampled, drafts)

    def advance(
        self, schedule: Schedule, sample_rows: np.ndarray | Sequence[int] | None = None
    ) -> list[bool]:
        """Once the step is dispatched: count its tokens as computed and move each row's slot
        bookkeeping to what the step writes, so the next step can be scheduled before this one's
        tokens are known. A row whose chunk reaches the last known token samples a token the
        host does not know yet: it is pending, in logits row `sample_rows[i]`, until `retire`.
        A row with k drafts moves on as if all k will be accepted: its 1 + k outputs are pending
        and the next row starts after them (`retire` corrects both). A row scheduled so, whose
        previous row then rejected drafts, moves back as the device moves it when it chains,
        else it is stale (`runtime.core.in_flight`). Returns, per item, whether it moved: not
        for a request finished or preempted since it was scheduled, nor for a stale row."""
        moved = []
        for i, item in enumerate(schedule.items):
            request = item.request
            if request.status is not RequestStatus.RUNNING:
                moved.append(False)
                continue
            if request.num_computed != item.start:  # scheduled on drafts since rejected
                if not item.chained_lanes:
                    self.in_flight.mark_stale(item)
                    moved.append(False)
                    continue
                item = self.in_flight.moved_back(item)
            moved.append(True)
            request.num_computed += item.num_tokens
            if item.lane_slots or request.num_computed >= request.num_tokens + request.num_pending:
                request.num_pending += max(len(item.lane_slots), 1)
                request.pending_row = 0 if sample_rows is None else int(sample_rows[i])
            self.slots.advance(item)
        return moved

    def retire(
        self, schedule: Schedule, sampled: list[int], drafts: Sequence[list[int]] = ()
    ) -> list[Request]:
        """Once the step's tokens are on the host: append them, stop requests, publish what the
        step wrote. Returns the requests that finished.

        `sampled[i]` is the token sampled from the logits of `schedule.items[i]`'s last token, or
        for a decode row with drafts the target's token after the accepted drafts `drafts[i]`:
        that row appends drafts[i] + [sampled[i]], cut at the first stop, and keeps the state of
        its lane len(drafts[i]). Rows of requests finished since the step was scheduled (a stop
        learned one step late, an abort) and stale rows are dropped; the states they wrote are
        still published (a stale row's are unkeyed, so dropped).
        """
        finished = []
        now = time.perf_counter()
        for i, (item, token) in enumerate(zip(schedule.items, sampled, strict=True)):
            request = item.request
            reason = None
            item, stale = self.in_flight.retiring(item)
            if stale or request.is_finished:
                self.slots.drop_lanes(item)
            elif item.lane_slots:
                reason = self._retire_lanes(item, [*drafts[i], int(token)], now)
            elif request.num_pending:  # its chunk sampled a token (else: a prefill, not the last)
                request.num_pending -= 1
                token = int(token)
                request.output_token_ids.append(token)
                if request.first_token_time is None:
                    request.first_token_time = now
                reason = stopping.stop_reason(request, token, self.config)
            self.slots.retired(item)
            if reason is not None:
                self._finish(request, reason)
                finished.append(request)
        self.slots.end_step()
        return finished

    def _retire_lanes(
        self, item: ScheduledRequest, tokens: list[int], now: float
    ) -> FinishReason | None:
        """A row with drafts: its request gains the accepted drafts and the target's token after
        them, and keeps the state of the last accepted lane. `advance` counted all of its drafts
        as accepted: the rejected ones are taken back. A request preempted since then recomputes
        every token it has, these included."""
        request = item.request
        request.num_pending -= item.num_tokens
        if request.first_token_time is None:
            request.first_token_time = now
        reason = stopping.append_tokens(request, tokens, self.config)
        if request.status is RequestStatus.RUNNING:
            request.num_computed -= item.num_tokens - len(tokens)
            self.slots.keep_lane(item, len(tokens) - 1)
        else:
            request.num_prefill_tokens = request.num_tokens
            self.slots.drop_lanes(item)
        return reason

    def _decode_rows(
        self, decoding: list[Request], budget: int, num_drafts: Callable[[Request], int]
    ) -> list[ScheduledRequest]:
        """Each decode row, oldest first, with the drafts it can afford (module docstring, 5)."""
        rows = []
        for request in decoding:
            wanted = 0 if self._drafts_unseen(request) else num_drafts(request)
            k = self._affordable_drafts(request, wanted, budget) if wanted > 0 else 0
            if k == 0:
                rows.append(self.in_flight.chained(self.slots.decode_row(request)))
                continue
            needed = self._blocks_needed(request, 1 + k)
            if needed:
                request.block_ids += self.slots.allocate_blocks(needed)
            row = self.slots.draft_row(request, self.slots.lane_slots(1 + k))
            rows.append(self.in_flight.chained(row))
            budget -= k
        return rows

    def _drafts_unseen(self, request: Request) -> bool:
        """Whether `request` follows a grammar and its drafts would reach the builder only on
        the device (the MTP head): its lanes' masks need them on the host, so it takes none."""
        speculative = self.config.speculative
        on_device = speculative is not None and speculative.drafts_on_device
        return on_device and request.grammar is not None

    @property
    def follows_grammar(self) -> bool:
        """Whether some running request follows a grammar (its masks need each token on the
        host: a program of several decode steps would not have it)."""
        return any(request.grammar is not None for request in self.running)

    def _affordable_drafts(self, request: Request, wanted: int, budget: int) -> int:
        """The most of `wanted` drafts the row may take: within K, the tokens it may still
        generate minus one, the token budget, the free lane slots and the free KV blocks."""
        params = request.sampling_params
        room = min(  # pending outputs count (asynchronous steps)
            params.max_tokens - request.num_sampled,
            self.config.max_model_len - request.num_tokens - request.num_pending,
        )
        k = min(wanted, self.max_drafts, room - 1, budget, self.slots.free_for_lanes() - 1)
        while k > 0 and not self.slots.can_allocate_blocks(self._blocks_needed(request, 1 + k)):
            k -= 1
        return max(k, 0)

    def _admit(self, prefills: list[ScheduledRequest], budget: int) -> None:
        """Admit waiting requests oldest first (module docstring, step 3)."""
        free_rows = self.config.max_num_seqs - len(self.running)
        for request in list(self.waiting):
            if free_rows == 0 or not self.slots.can_start() or request.num_pending:
                return  # a preempted request waits for its pending tokens (a program of steps)
            # Its recompute covers every token it has: tokens pending when it was preempted
            # were appended since (several, from a program of decode steps).
            request.num_prefill_tokens = request.num_tokens
            free_rows -= 1  # admitted now, or kept for it while younger requests go ahead
            hit = self.slots.take_hit(request)
            num_tokens = self._chunk_len(request, budget)
            num_blocks = self._blocks_needed(request, num_tokens)
            if num_tokens == 0 or not self.slots.can_allocate_blocks(num_blocks):
                self.slots.drop_hit(request, hit)
                if num_tokens == 0:
                    continue
                return
            self._start(request, num_blocks)
            self.slots.admitted(request, hit)
            prefills.append(ScheduledRequest(request, request.num_computed, num_tokens))
            budget -= num_tokens

    def _chunk_len(self, request: Request, budget: int) -> int:
        """Prefill tokens to feed: all that remain if they fit, else up to a multiple of the
        alignment; never past the prompt's last multiple of it where the config asks for that
        boundary to end a chunk (module docstring, step 2)."""
        a, done = self.alignment, request.num_computed
        end = request.num_prefill_tokens
        if self.config.ends_chunk_at_last_boundary and done < end // a * a:
            end = end // a * a
        if end - done <= budget:
            return end - done
        return max((done + budget) // a * a - done, 0)

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
        while not self.slots.can_allocate_blocks(needed):
            victim = self.running[-1]
            preempted.append(self._preempt(victim))
            if victim is request:
                return False
        if needed:
            request.block_ids += self.slots.allocate_blocks(needed)
        return True

    def _start(self, request: Request, num_blocks: int) -> None:
        self.waiting.remove(request)
        self.slots.start(request)
        request.block_ids += self.slots.allocate_blocks(num_blocks)  # after a hit's blocks
        request.status = RequestStatus.RUNNING
        _insert_by_arrival(self.running, request)

    def _preempt(self, request: Request) -> Request:
        self.running.remove(request)
        self.slots.release(request)
        request.reset_for_recompute()
        _insert_by_arrival(self.waiting, request)
        self.num_preemptions += 1
        return request

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request in self.running:
            self.running.remove(request)
            self.slots.release(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = time.perf_counter()


def _insert_by_arrival(queue: list[Request], request: Request) -> None:
    """Keep `queue` oldest first; a request preempted for recompute goes back to its place."""
    bisect.insort(queue, request, key=lambda r: r.arrival_time)
