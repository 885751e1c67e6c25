"""`Scheduler`: every policy decision of a step (admission, chunking, preemption, prefix caching),
in plain Python.

Continuous batching with chunked prefill under a token budget B (`max_num_batched_tokens`), at
most S = `max_num_seqs` rows per step, alignment a: the model's `chunk_size` c, or the
`state_block_size` when prefix caching runs in "align" mode. Each step:

1. Running requests are served oldest first (by arrival). Each running decode gets its one token
   from lanes set aside before any prefill is served, so decodes never wait for prefills.
2. Running prefills share the rest, oldest first. A prefill chunk ends on an absolute multiple of
   a unless it ends the tokens to prefill, so a request's result does not depend on how its
   prompt was cut (DESIGN.md section 5, invariant 7; a is a multiple of c). In "align" mode a
   chunk also stops at the last multiple of a in the prompt: the tail after it is a chunk of its
   own, so the state at that boundary is a chunk end and gets cached.
3. Waiting requests are admitted oldest first with the tokens left. With prefix caching a request
   first looks up its longest cached prefix (runtime/prefix_cache.py) and starts after it. A
   request that cannot get a chunk of the tokens left keeps its place and its row for a later
   step, and the requests behind it may use those tokens (fewer than a, which it could not use):
   no head-of-line blocking on the budget. Running out of rows, state slots or KV blocks stops
   admission instead, because the requests behind would take what the older one is waiting for.
4. When the KV block pool runs out (after evicting unused cached blocks), the youngest running
   request is preempted: it gives back its blocks and slots and later recomputes everything it
   had (prompt + output) as a fresh prefill, from its longest cached prefix.
5. Speculative decoding (`config.speculative`, K drafts at most): after steps 1-3, each decode row,
   oldest first, gets k <= K drafts out of what is left (tokens of the budget, free KV blocks,
   free state slots, less what the prefix cache's state budget may still
   take), never more than its drafter proposes nor than the tokens it may still
   generate minus one, and 1 + k fresh lane slots (the state after each of its tokens). Drafts
   never preempt and never take what a prefill or an admission could use, so the fairness bound
   below is unchanged; k = 0 rows take the same path.
   With prefix caching "all", an accepted lane that ends on a state block boundary gives its slot
   to the cache (published at once: its step has run); rejected lanes publish nothing.

Fairness. B >= a + S - 1 is required (`min_token_budget`): a full aligned chunk always fits beside
a full decode batch (a step with a prefill row has at most S - 1 decode rows). Hence, while rows,
slots and blocks last, the oldest request still prefilling advances by at least k = (B - S + 1)
// a aligned chunks every step, or finishes its prompt (in "align" mode: or reaches the last
multiple of a in its prompt, after which its tail of fewer than a tokens takes one step): if it
runs, no older prefill takes tokens before it and at most S - 1 lanes are set aside; if it waits,
it has a free row and no running prefill is older than it (a request that overtook it in step 3
had fewer than a tokens left to prefill, so it finished its prefill in that step). So a request's
first token comes at most sum_j ceil(L_j / (k * a)) steps after it arrives, plus one step per
request in "align" mode, over the requests j that arrived no later (itself included; L_j their
prompt lengths); a prefix hit only shortens L_j. tests/runtime/test_scheduler_fairness.py checks
this bound. A request kept out for lack of rows, slots or blocks waits for running requests to
finish or be preempted, and no younger request is admitted before it meanwhile, so it is not
starved either.

Prefix caching (runtime/prefix_cache.py) is decided here too: which cached prefix an admitted
request starts after, which state slots a step writes boundary states to (reserved now,
published by `postprocess` after the step has run), and which slot each row reads and writes
(runtime/row_slots.py keeps that slot bookkeeping; runtime/schedule.py holds the decision).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

from runtime.config import EngineConfig, min_token_budget
from runtime.pools import NULL, Pool
from runtime.prefix_cache import PrefixCache
from runtime.request import FinishReason, Request, RequestStatus
from runtime.row_slots import RowSlots
from runtime.schedule import Schedule, ScheduledRequest

__all__ = ["Schedule", "ScheduledRequest", "Scheduler"]  # the first two moved to runtime.schedule


class Scheduler:
    """Waiting and running requests (each oldest first), the block pool and the state-slot pool."""

    def __init__(
        self, config: EngineConfig, chunk_size: int, *, uses_blocks: bool, uses_slots: bool
    ) -> None:
        config = config.resolved(chunk_size)
        alignment = config.prefill_alignment(chunk_size)
        needed = min_token_budget(alignment, config.max_num_seqs)
        if config.max_num_batched_tokens < needed:
            unit = (f"state_block_size={alignment} (prefix_caching='align')"
                    if alignment != chunk_size else f"model's chunk_size={chunk_size}")  # fmt: skip
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} must be >= chunk_size + "
                f"max_num_seqs - 1 = {needed}: one full prefill chunk of the {unit} must fit "
                "beside a full decode batch"
            )
        self.config = config
        self.chunk_size = chunk_size
        self.alignment = alignment
        self.uses_blocks = uses_blocks
        self.uses_slots = uses_slots
        self.block_pool = Pool("KV block", config.num_blocks)
        self.slot_pool = Pool("state slot", config.num_slots)
        self.prefix_cache = (
            PrefixCache(self.block_pool, self.slot_pool, block_size=config.block_size,
                        state_block_size=config.state_block_size,
                        max_cached_states=config.max_cached_states, uses_blocks=uses_blocks,
                        uses_slots=uses_slots)
            if config.caches_prefixes else None
        )  # fmt: skip
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        spec = config.speculative
        self.num_speculative_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.slots = RowSlots(config, self.block_pool, self.slot_pool, self.prefix_cache,
                              uses_slots=uses_slots)  # fmt: skip

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
                if request.num_pending and self._ends_with_pending(request):
                    continue  # its pending token is its last: it finishes when that retires
                # Only a token that starts a new KV block needs one (every block_size steps).
                needs_block = self.uses_blocks and request.num_computed >= (
                    len(request.block_ids) * block_size)  # fmt: skip
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
        if self.num_speculative_tokens:
            items = [ScheduledRequest(r, r.num_computed, 1) for r in decoding]
            left = self.budget - len(items) - sum(item.num_tokens for item in prefills)
            items = self._speculate(items, left, num_drafts or (lambda _: 0))
            decodes = [self.slots.assign(item, decode=True) for item in items]
        else:
            decodes = [self.slots.decode_row(request) for request in decoding]
        prefills = [self.slots.assign(item, decode=False) for item in prefills]
        return Schedule(decodes, prefills, preempted)

    def postprocess(
        self, schedule: Schedule, sampled: list[int], drafts: Sequence[list[int]] | None = None
    ) -> list[Request]:
        """After a step ran: `advance`, then `retire` (a synchronous engine step)."""
        self.advance(schedule)
        return self.retire(schedule, sampled, drafts)

    def advance(self, schedule: Schedule, sample_rows: Sequence[int] | None = None) -> None:
        """Once the step is dispatched: count its tokens as computed and move each row's state
        bookkeeping to what the step writes, so the next step can be scheduled before this one's
        tokens are known. A row whose chunk reaches the last known token samples a token the
        host does not know yet: it is pending, in logits row `sample_rows[i]`, until `retire`.
        Speculative rows advance in `retire` (how many drafts are accepted decides by how much);
        a request finished or preempted since it was scheduled does not advance."""
        for i, item in enumerate(schedule.items):
            request = item.request
            if item.lane_slots or request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed += item.num_tokens
            if request.num_computed >= request.num_tokens + request.num_pending:
                request.num_pending += 1
                request.pending_row = 0 if sample_rows is None else int(sample_rows[i])
            if self.prefix_cache is not None:
                self.slots.advance(item)

    def retire(
        self, schedule: Schedule, sampled: list[int], drafts: Sequence[list[int]] | None = None
    ) -> list[Request]:
        """Once the step's tokens are on the host: append them, stop requests, publish what the
        step wrote to the prefix cache. Returns the requests that finished.

        `sampled[i]` is the token sampled from the logits of `schedule.items[i]`'s last token, or
        for a speculative decode row the target's token after the accepted drafts `drafts[i]`:
        the row appends drafts[i] + [sampled[i]], cut at the first stop, and keeps the state of
        its lane len(drafts[i]). Rows of requests finished since the step was scheduled (a stop
        learned one step late, an abort) are dropped.
        """
        finished = []
        now = time.perf_counter()
        cache, block_size = self.prefix_cache, self.config.block_size
        for i, (item, token) in enumerate(zip(schedule.items, sampled, strict=True)):
            request = item.request
            if request.status is RequestStatus.FINISHED:  # the states it wrote are still valid
                if item.new_states:
                    self.slots.publish(item)
                continue
            tokens = None
            if item.lane_slots:
                accepted = drafts[i] if drafts is not None else []
                request.num_computed += len(accepted) + 1
                request.draft_token_ids = []
                tokens = [*accepted, token]
            reason = None
            if tokens is not None or request.num_pending:  # else a prefill chunk, not the last
                if request.first_token_time is None:
                    request.first_token_time = now
                if tokens is None:  # one token (the common case, without a list)
                    request.num_pending -= 1
                    token = int(token)
                    request.output_token_ids.append(token)
                    reason = self._stop_reason(request, token)
                else:
                    reason = self._append(request, tokens)
            if tokens is not None:
                self.slots.keep_lane(item, len(tokens) - 1)
                if cache is not None:
                    self.slots.advance(item)
            # Exactly the cases `RowSlots.publish` acts on (states written, a KV block filled
            # since `num_cached_blocks`): most decode rows skip it.
            if cache is not None and (
                item.new_states or request.num_computed // block_size > request.num_cached_blocks
            ):
                self.slots.publish(item)
            if reason is not None:
                self._finish(request, reason)
                finished.append(request)
        return finished

    def _append(self, request: Request, tokens: list[int]) -> FinishReason | None:
        """Append `tokens` to the request's output up to the first that stops it; returns why it
        stops (None: it goes on)."""
        for token in tokens:
            request.output_token_ids.append(int(token))
            reason = self._stop_reason(request, int(token))
            if reason is not None:
                return reason
        return None

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
                k = min(k, self.slots.free_for_lanes() - (len(decodes) - i))
            while k > 0 and not self._can_allocate_blocks(self._blocks_needed(request, 1 + k)):
                k -= 1
            if k > 0:
                request.block_ids += self._allocate_blocks(self._blocks_needed(request, 1 + k))
            lanes = self.slot_pool.allocate(1 + k) if self.uses_slots else [0] * (1 + k)
            rows.append(item._replace(num_tokens=1 + k, lane_slots=tuple(lanes)))
            budget -= k
        return rows

    def _admit(self, prefills: list[ScheduledRequest], budget: int) -> None:
        """Admit waiting requests oldest first (module docstring, step 3)."""
        free_rows = self.config.max_num_seqs - len(self.running)
        for request in list(self.waiting):
            if free_rows == 0 or (self.uses_slots and not self.slot_pool.can_allocate(1)):
                return
            free_rows -= 1  # admitted now, or kept for it while younger requests go ahead
            hit = self.slots.take_hit(request)
            num_tokens = self._chunk_len(request, budget)
            num_blocks = self._blocks_needed(request, num_tokens)
            if num_tokens == 0 or not self._can_allocate_blocks(num_blocks):
                self.slots.drop_hit(request, hit)
                if num_tokens == 0:
                    continue
                return
            self._start(request, num_blocks)
            if self.prefix_cache is not None:
                self.prefix_cache.touch(request, hit)
                request.num_cached_tokens = hit.num_tokens
            prefills.append(ScheduledRequest(request, request.num_computed, num_tokens))
            budget -= num_tokens

    def _chunk_len(self, request: Request, budget: int) -> int:
        """Prefill tokens to feed: all that remain if they fit, else up to a multiple of the
        alignment; in "align" mode never past the last multiple of it before the prompt's end."""
        a, done = self.alignment, request.num_computed
        end = request.num_prefill_tokens
        if self.config.prefix_caching == "align" and done < end // a * a:
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
        while not self._can_allocate_blocks(needed):
            victim = self.running[-1]
            preempted.append(self._preempt(victim))
            if victim is request:
                return False
        if needed:
            request.block_ids += self._allocate_blocks(needed)
        return True

    def _can_allocate_blocks(self, n: int) -> bool:
        if self.prefix_cache is None:
            return self.block_pool.can_allocate(n)
        return self.prefix_cache.can_allocate_blocks(n)

    def _allocate_blocks(self, n: int) -> list[int]:
        if self.prefix_cache is None:
            return self.block_pool.allocate(n)
        return self.prefix_cache.allocate_blocks(n)

    def _start(self, request: Request, num_blocks: int) -> None:
        self.waiting.remove(request)
        if self.uses_slots:
            request.state_slot = self.slot_pool.allocate(1)[0]
        request.block_ids += self._allocate_blocks(num_blocks)  # after a hit's cached blocks
        request.status = RequestStatus.RUNNING
        _insert_by_arrival(self.running, request)

    def _release(self, request: Request) -> None:
        self.block_pool.free(request.block_ids)
        held = [slot for slot in (request.state_slot, request.read_slot) if slot]
        self.slot_pool.free(held)
        request.block_ids, request.state_slot, request.read_slot = [], NULL, NULL

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

    def _ends_with_pending(self, request: Request) -> bool:
        """Whether the pending token reaches max_tokens or max_model_len (counts, known before
        the token itself)."""
        num_outputs = request.num_sampled
        num_tokens = len(request.prompt_token_ids) + num_outputs
        return num_outputs >= request.sampling_params.max_tokens or (
            num_tokens >= self.config.max_model_len
        )

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.sampling_params
        num_outputs = len(request.output_token_ids)  # `token` included
        if token in request.stop_ids and num_outputs > params.min_tokens:
            return FinishReason.STOP
        num_tokens = len(request.prompt_token_ids) + num_outputs  # request.num_tokens, inlined
        if num_outputs >= params.max_tokens or num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None


def _insert_by_arrival(queue: list[Request], request: Request) -> None:
    """Keep `queue` oldest first; a request preempted for recompute goes back to its place."""
    bisect.insort(queue, request, key=lambda r: r.arrival_time)
