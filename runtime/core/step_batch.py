"""`StepBatch`: one rank's built step (device inputs, sampling inputs, where each request's logits
are, where each token lane's token comes from) and the checks of its invariants."""

from __future__ import annotations

import dataclasses

import numpy as np

from jmamba.step_inputs import NextTokens, StepInputs
from runtime.core.config import EngineConfig
from runtime.core.penalties import check_penalties
from runtime.core.sampling_inputs import SamplingInputs, SamplingMode


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
    """

    inputs: StepInputs
    sampling: SamplingInputs
    mode: SamplingMode
    sample_rows: np.ndarray
    token_sources: np.ndarray
    following: NextTokens

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
        """ValueError unless the inputs keep the invariants (`StepInputs.validate`, with the pool
        sizes of `config` and what the prefix cache published) and the token sources theirs."""
        self.inputs.validate(
            block_size=config.block_size,
            chunk_size=chunk_size,
            num_blocks=config.num_blocks,
            num_slots=config.num_slots,
            vocab_size=vocab_size,
            published_slots=published_slots,
            published_blocks=published_blocks,
        )
        self.validate_token_sources(num_carried)
        if self.sampling.penalties is not None:
            fed_lanes = self.token_sources[np.asarray(self.inputs.logits_indices)]
            check_penalties(self.sampling.penalties, fed_lanes, vocab_size)

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
