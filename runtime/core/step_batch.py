"""`StepBatch`: one rank's built step (device inputs, sampling inputs, where each request's logits
are, where each token lane's token comes from) and the checks of its invariants."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from jmamba.step.inputs import NextTokens, StepInputs
from jmamba.step.invariants import check_step_inputs
from runtime.core.config import EngineConfig
from runtime.core.penalties import check_penalties, widened_penalties
from runtime.core.sampling_inputs import SamplingInputs, SamplingMode


class ChainedRows(NamedTuple):
    """How a carrying step's decode rows follow the rows of the step before it, which the device
    verifies just before (asynchronous drafting: docs/architecture.md section 4, "Drafting steps
    chain"). A row that chains on a row with K drafts was scheduled as if all K are accepted;
    when the device finds the last d of them rejected, it moves the row back by d: its first
    lane feeds the token sampled at the last accepted lane, its positions, KV slots, context
    length and sample counters drop by d, and it reads the state of the last accepted lane.

    Attributes:
      may_shift: [R_d] bool, row r moves back by its previous row's rejected drafts (False: it
        runs where it was scheduled; padding rows False).
      fallback_slots: [R_d, W] int32, column d of row r is the slot it reads (a one-token row
        also writes it, in place) when the last d drafts were rejected: lane K - d of the row
        it chains on. NULL in column 0, past K, and in rows that do not shift.
    """

    may_shift: np.ndarray
    fallback_slots: np.ndarray


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """A built step: device inputs, sampling inputs, and where each scheduled request's logits are.

    Attributes:
      inputs: the padded `StepInputs`.
      sampling: the padded `SamplingInputs`.
      mode: what the sampler computes this step (static: with the bucket, it picks the variant).
      sample_rows: [num scheduled] int, logits row of `schedule.items[i]`.
      token_sources: [T] int32 per token lane, where its token comes from: NULL (0) takes
        `inputs.token_ids`; r + 1 takes the token the previous step sampled in logits row r,
        still on the device (asynchronous scheduling; `inputs.token_ids` holds 0 there).
      following: what follows each prefill row's chunk (read by a step that drafts with the MTP
        head, `jmamba.mtp`).
      chained: how its decode rows follow the previous step's (read by a carrying step of an
        engine that drafts on the device).
    """

    inputs: StepInputs
    sampling: SamplingInputs
    mode: SamplingMode
    sample_rows: np.ndarray
    token_sources: np.ndarray
    following: NextTokens
    chained: ChainedRows

    def with_mode(self, mode: SamplingMode) -> StepBatch:
        """This batch for a sampler that computes at least what it needs (the mode data-parallel
        ranks agreed on): `masked_ids` widened to `mode.mask_width` with dead (ignored) columns,
        the penalty tables to `mode.penalty_width` with neutral ones."""
        if mode == self.mode:
            return self
        if (mode.as_array() < self.mode.as_array()).any():
            raise ValueError(
                f"sampling mode {mode} computes less than this batch needs: {self.mode}"
            )
        sampling = self.sampling
        ids = sampling.masked_ids
        wider = np.pad(ids, ((0, 0), (0, mode.mask_width - ids.shape[1])))
        penalties = widened_penalties(sampling.penalties, ids.shape[0], mode.penalty_width)
        sampling = sampling._replace(masked_ids=wider, penalties=penalties)
        return dataclasses.replace(self, sampling=sampling, mode=mode)

    def validate(
        self,
        config: EngineConfig,
        *,
        chunk_size: int | None,
        vocab_size: int,
        published_slots: np.ndarray | None = None,
        published_blocks: np.ndarray | None = None,
        num_carried: int = 0,
    ) -> None:
        """ValueError unless the inputs keep the invariants (`check_step_inputs`, with the pool
        sizes of `config` and what the prefix cache published) and the token sources theirs."""
        check_step_inputs(
            self.inputs,
            block_size=config.block_size,
            chunk_size=chunk_size,
            num_blocks=config.num_blocks,
            num_slots=config.num_slots,
            vocab_size=vocab_size,
            published_slots=published_slots,
            published_blocks=published_blocks,
        )
        self.validate_token_sources(num_carried)
        self.validate_chained()
        if self.sampling.penalties is not None:
            fed_lanes = self.token_sources[np.asarray(self.inputs.logits_indices)]
            check_penalties(self.sampling.penalties, fed_lanes, vocab_size)

    def validate_chained(self) -> None:
        """ValueError unless fallback slots sit only in decode rows that may shift (column 0
        NULL) and none is a slot another row reads or writes: the device may read (and a
        one-token row write) one instead of the row's read slot (invariant 2)."""
        fallback, may_shift = self.chained.fallback_slots, self.chained.may_shift
        misplaced = np.nonzero((fallback[:, 0] != 0) | (~may_shift & (fallback != 0).any(1)))[0]
        if misplaced.size:
            rows = misplaced.tolist()
            raise ValueError(f"decode rows {rows} hold fallback slots they may not use")
        decode, prefill = self.inputs.decode, self.inputs.prefill
        for row in np.nonzero(may_shift)[0]:
            others = np.concatenate(
                [
                    np.delete(np.asarray(decode.read_slots), row),
                    np.delete(np.asarray(decode.write_slots), row, axis=0).reshape(-1),
                    np.asarray(prefill.read_slots),
                    np.asarray(prefill.write_slots),
                ]
            )
            shared = np.intersect1d(fallback[row][fallback[row] != 0], others[others != 0])
            if shared.size:
                raise ValueError(
                    f"decode row {row}'s fallback slots {shared.tolist()} are other rows' slots"
                )

    def validate_token_sources(self, num_carried: int) -> None:
        """ValueError unless every non-NULL source is a live decode lane's, within the
        `num_carried` tokens a step hands to the next, with token id 0 (NULL) in `inputs`."""
        sources, decode = self.token_sources, self.inputs.decode
        live = np.zeros(sources.size, bool)
        lanes = np.arange(decode.width)[None, :] < np.asarray(decode.query_lens)[:, None]
        live[: lanes.size] = lanes.reshape(-1)
        wrong = ~live | (sources > num_carried) | (np.asarray(self.inputs.token_ids) != 0)
        bad = np.nonzero((sources != 0) & wrong)[0]
        if bad.size:
            raise ValueError(
                f"token lanes {bad.tolist()} take sources {sources[bad].tolist()}: a "
                f"source must be a live decode lane's, in 1..{num_carried}, with "
                "token id 0"
            )
