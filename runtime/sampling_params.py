"""`SamplingParams`: how one request picks its next tokens and when it stops."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping options.

    Attributes:
      temperature: 0 means greedy (argmax); otherwise logits are divided by it before sampling.
      top_k: keep the k most likely tokens; 0 means no limit.
      top_p: keep the smallest set of tokens whose probability mass reaches top_p; 1.0 means all.
      max_tokens: stop after this many generated tokens.
      seed: makes sampling of this request reproducible whatever else is in the batch; None picks
        one from the engine's seed and the request's arrival order.
      stop_token_ids: stop after generating any of these tokens (the stop token is kept).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0 or self.temperature == float("inf"):
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an int >= 0 (0 disables top-k)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an int >= 1")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise ValueError(f"seed={self.seed!r} must be None or an int in [0, 2**32)")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
