"""The draft model's per-request bookkeeping: `DraftSequence` (its view of one request) and
`RankDrafts` (one rank's draft pools and sequences, and the rows of each draft pass; no jax).

runtime/speculative/draft_model.py runs the passes; this module says which rows each pass has.
"""

from __future__ import annotations

from runtime.core.config import EngineConfig
from runtime.core.pools import NULL, Pool
from runtime.core.request import Request, RequestStatus, sampling_row
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule, ScheduledRow, StepSchedule


class DraftSequence:
    """The draft model's view of one request, as a `RowSequence` the builder reads: the request's
    tokens followed by the drafts proposed so far in this step, its own KV blocks and state
    slots, greedy sampling with the request's min_tokens masks.

    Attributes:
      request: the target request.
      committed: the slot holding the draft model's state after `num_computed` tokens.
      scratch: the slot the proposal passes write (NULL outside them).
      state_slot: the slot the next pass reads (set by `RankDrafts` before each pass).
      block_ids: the draft model's KV blocks of this request.
      num_computed: tokens of the request whose effect is in the committed slot.
      drafts: this step's drafts d_1, d_2, ...
      first_output: the output index that lane 0 of the next pass samples (the builder masks the
        stop ids on lanes short of min_tokens, as the target does, so that the draft model
        proposes what the target can accept).
      num_preemptions: the request's count when this sequence began (a preempted request
        starts a new one).
    """

    seed = 0
    pending_row = 0  # the draft model's steps carry no tokens from step to step
    masked_token_ids = ()  # a prefill row's token is never a draft
    penalty_history = None  # the draft model samples greedily, without penalties
    grammar = None  # it proposes freely: the target's grammar masks reject what breaks it

    def __init__(self, request: Request, slot: int) -> None:
        self.request = request
        params = request.sampling_params
        self.sampling_params = SamplingParams(
            max_tokens=params.max_tokens, min_tokens=params.min_tokens
        )
        self.stop_ids = request.stop_ids
        self.sampling_row = sampling_row(self.sampling_params, self.seed)
        self.committed = self.state_slot = slot
        self.scratch = self.first_output = 0
        self.block_ids: list[int] = []
        self.num_computed = 0
        self.drafts: list[int] = []
        self.num_preemptions = request.num_preemptions

    @property
    def output_token_ids(self) -> list[int]:
        """The target request's outputs on the host."""
        return self.request.output_token_ids

    @property
    def num_sampled(self) -> int:
        return self.first_output

    @property
    def num_tokens(self) -> int:
        """The request's tokens and this step's drafts so far: every token a pass may feed."""
        return self.request.num_tokens + len(self.drafts)

    def token_at(self, index: int) -> int:
        num_tokens = self.request.num_tokens
        if index < num_tokens:
            return self.request.token_at(index)
        return self.drafts[index - num_tokens]

    def token_ids(self, start: int, stop: int) -> list[int]:
        n = self.request.num_tokens
        head = self.request.token_ids(start, min(stop, n))
        return head + self.drafts[max(start - n, 0) : max(stop - n, 0)]


Drafts = StepSchedule[DraftSequence]  # the draft model's own steps: rows of its sequences


class RankDrafts:
    """One rank's draft-model pools and sequences, and the rows of each draft pass.

    Passes of one engine step (runtime/speculative/draft_model.py, module docstring): fill passes
    (`fill_pass`) while a prefill chunk starts past its sequence, then the catch-up pass
    (`catch_up`), then the proposal passes (`proposal`, j = 2..K).
    """

    def __init__(self, config: EngineConfig, uses_blocks: bool, uses_slots: bool) -> None:
        self.config = config
        self.uses_blocks, self.uses_slots = uses_blocks, uses_slots
        self.block_pool = Pool("draft KV block", config.num_blocks)
        self.slot_pool = Pool("draft state slot", config.num_slots)
        self.sequences: dict[Request, DraftSequence] = {}

    def sequence(self, request: Request) -> DraftSequence:
        """The request's sequence; a new one (a fresh committed slot, no token) the first time."""
        seq = self.sequences.get(request)
        if seq is None:
            seq = self.sequences[request] = DraftSequence(request, self.allocate(1)[0])
        return seq

    def allocate(self, n: int) -> list[int]:
        """n fresh slots (NULL for a model without recurrent state; the pool is sized for
        1 + K lane slots per decode row beside each request's committed slot)."""
        return self.slot_pool.allocate(n) if self.uses_slots else [NULL] * n

    def free(self, slots: list[int]) -> None:
        if self.uses_slots:
            self.slot_pool.free(slots)

    def reserve_blocks(self, seq: DraftSequence, num_tokens: int) -> None:
        """KV blocks for positions [0, num_tokens) (the pool is sized never to run short)."""
        if self.uses_blocks:
            total = -(-num_tokens // self.config.block_size)
            if total > len(seq.block_ids):
                seq.block_ids += self.block_pool.allocate(total - len(seq.block_ids))

    def release_done(self) -> None:
        """Drop the sequences of requests that finished, were aborted or were preempted."""
        for request, seq in list(self.sequences.items()):
            running = request.status is RequestStatus.RUNNING
            if running and request.num_preemptions == seq.num_preemptions:
                continue
            self.block_pool.free(seq.block_ids)
            self.free([seq.committed])
            del self.sequences[request]

    def fill_pass(self, schedule: Schedule, budget: int, max_rows: int, chunk: int) -> Drafts:
        """Prefill rows that bring sequences up to where the target's prefill chunk starts: a
        target that started a request after a cached prefix (or that returned to one after a
        preemption) skipped tokens the draft model has not seen. At most `budget` tokens and
        `max_rows` rows; a row that does not reach its chunk's start stops on a multiple of the
        draft model's `chunk` size (its own chunking invariant)."""
        rows: list[ScheduledRow[DraftSequence]] = []
        for item in schedule.prefills:
            seq = self.sequence(item.request)
            start, lagging = seq.num_computed, item.start - seq.num_computed
            n = lagging if lagging <= budget else (start + budget) // chunk * chunk - start
            if lagging <= 0 or n <= 0:
                continue
            self.reserve_blocks(seq, start + n)
            seq.state_slot = seq.committed
            read = seq.committed if start else NULL  # a first chunk starts from zeros
            rows.append(ScheduledRow(seq, start, n, read_slot=read, write_slot=seq.committed))
            budget -= n
            if len(rows) == max_rows:
                break
        return StepSchedule([], rows, [])

    def catch_up(self, schedule: Schedule) -> Drafts:
        """The draft model's catch-up pass: each prefill chunk of the target, and per decode row
        the tokens the request gained since the draft model last ran."""
        decodes: list[ScheduledRow[DraftSequence]] = []
        prefills: list[ScheduledRow[DraftSequence]] = []
        for item in schedule.decodes:
            seq = self.sequences[item.request]
            n = item.request.num_tokens
            self.reserve_blocks(seq, n + max(item.num_tokens - 2, 0))  # + the proposal passes
            seq.state_slot, seq.drafts = seq.committed, []
            lanes = n - seq.num_computed
            seq.first_output = len(item.request.output_token_ids) - (lanes - 1)
            slots = tuple(self.allocate(lanes))
            row = ScheduledRow(
                seq, seq.num_computed, lanes, read_slot=seq.state_slot, lane_slots=slots
            )
            decodes.append(row)
        for item in schedule.prefills:
            seq = self.sequence(item.request)
            if seq.num_computed != item.start:  # the fill passes ran up to every chunk's start
                raise RuntimeError(
                    f"draft model at token {seq.num_computed}, chunk at {item.start}"
                )
            self.reserve_blocks(seq, item.start + item.num_tokens)
            seq.state_slot = seq.committed
            read = seq.committed if item.start else NULL  # a first chunk starts from zeros
            row = ScheduledRow(
                seq, item.start, item.num_tokens, read_slot=read, write_slot=seq.committed
            )
            prefills.append(row)
        return StepSchedule(decodes, prefills, [])

    def after_catch_up(self, schedule: Drafts, tokens: list[int]) -> None:
        """Commit the catch-up pass; each decode row's token is its first draft."""
        for item, token in zip(schedule.decodes, tokens[: len(schedule.decodes)], strict=True):
            seq = item.request
            self.free([seq.committed, *item.lane_slots[:-1]])
            seq.committed = seq.state_slot = item.lane_slots[-1]
            seq.num_computed += item.num_tokens
            seq.drafts = [int(token)]
        self.after_prefills(schedule)

    @staticmethod
    def after_prefills(schedule: Drafts) -> None:
        """The prefill rows' sequences now hold their chunks (in their committed slots)."""
        for item in schedule.prefills:
            item.request.num_computed += item.num_tokens

    def proposal(self, schedule: Schedule, j: int) -> Drafts:
        """Pass j >= 2: rows that want a j-th draft feed their (j-1)-th."""
        rows: list[ScheduledRow[DraftSequence]] = []
        for item in schedule.decodes:
            if item.num_tokens - 1 < j:
                continue
            seq = self.sequences[item.request]
            if j == 2:
                seq.scratch = self.allocate(1)[0]
            seq.state_slot = seq.committed if j == 2 else seq.scratch
            seq.first_output = len(item.request.output_token_ids) + j - 1
            start = seq.num_computed + j - 2
            rows.append(
                ScheduledRow(seq, start, 1, read_slot=seq.state_slot, lane_slots=(seq.scratch,))
            )
        return StepSchedule(rows, [], [])

    def end_proposals(self, schedule: Schedule) -> list[tuple[int, ...]]:
        """Give back the scratch slots; return the decode rows' drafts, in order."""
        drafts = []
        for item in schedule.decodes:
            seq = self.sequences[item.request]
            if item.num_tokens > 2:  # it ran proposal passes
                self.free([seq.scratch])
            seq.scratch, seq.state_slot = 0, seq.committed
            drafts.append(tuple(seq.drafts[: item.num_tokens - 1]))
        return drafts
