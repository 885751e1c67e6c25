"""`StepResult`: what one step gave back, on the host (`ModelRunner.fetch`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from runtime.core.sampling_inputs import TokenLogprobs
from runtime.core.step_batch import StepBatch


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A fetched step, per local rank i (N: the bucket's logits rows).

    Attributes:
      tokens: tokens[i] [N] int32, every logits row's sampled token.
      accepted: accepted[i] [N] int32, 1 where the row's token equals the draft the next lane fed
        (`runtime.device.sampler.accept_drafts`).
      drafts: drafts[i] [1 + k, N] int32, the drafts for the next step when the step drafted on
        the device (`runtime.device.mtp_drafts`); else None.
      logprobs: logprobs[i], the `TokenLogprobs` of each scheduled request's sampled row when the
        step's sampling mode asked for them; else None.
      logits: [local ranks, N, vocab] fp32 when the runner keeps logits; else None.
    """

    tokens: list[np.ndarray]
    accepted: list[np.ndarray]
    drafts: list[np.ndarray] | None
    logprobs: list[TokenLogprobs[np.ndarray]] | None
    logits: np.ndarray | None

    @classmethod
    def of_rows(
        cls,
        tokens: np.ndarray,
        logprobs: TokenLogprobs[np.ndarray] | None,
        logits: np.ndarray | None,
        batches: list[StepBatch],
    ) -> StepResult:
        """One step's result from its rows of the outputs, per local rank (tokens [ranks,
        2 (+ 1 + k), N]: `runtime.device.step_buffers.StepOutputs`), each scheduled request's
        log-probabilities taken from its sampled row (`batches[i].sample_rows`)."""
        return cls(
            tokens=list(tokens[:, 0]),
            accepted=list(tokens[:, 1]),
            drafts=list(tokens[:, 2:]) if tokens.shape[1] > 2 else None,
            logprobs=None
            if logprobs is None
            else [
                TokenLogprobs(*(a[i][batch.sample_rows] for a in logprobs))
                for i, batch in enumerate(batches)
            ],
            logits=logits,
        )

    def drafts_of(self, rank: int) -> np.ndarray | None:
        """drafts[rank], or None when the step drafted nothing on the device."""
        return None if self.drafts is None else self.drafts[rank]
