"""`SamplingParams`: how one request picks its next tokens and when it stops."""

from __future__ import annotations

import dataclasses

from runtime.core import checks
from runtime.core.structured_output import StructuredOutput

MAX_LOGPROBS = 20  # most alternatives `logprobs=k` may ask for per token
MAX_ADDITIVE_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI allows


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping options.

    A request stops at the first of: a stop token (finish reason "stop": one of `stop_token_ids`
    or, unless `ignore_eos`, an EOS id of the model's config.json / generation_config.json; the
    stop token is kept in the output), a stop string in the output text (finish reason "stop"),
    `max_tokens` generated tokens, or prompt + output reaching the engine's `max_model_len` (both
    finish reason "length"). Prompt + output never exceeds
    max_model_len: when max_tokens asks for more than the room left, the request ends early with
    "length"; a prompt of max_model_len tokens or more has no room and is refused (ValueError).

    Attributes:
      temperature: 0 means greedy (argmax); otherwise logits are divided by it before sampling.
      top_k: keep the k most likely tokens; 0 means no limit.
      top_p: keep the smallest set of tokens whose probability mass reaches top_p; 1.0 means all.
      max_tokens: stop after this many generated tokens.
      min_tokens: the stop tokens (EOS included) cannot be generated before this many tokens: their
        logits are masked to -inf in the sampler, for greedy and sampled requests alike.
      seed: makes sampling of this request reproducible whatever else is in the batch; None picks
        one from the engine's seed and the request's arrival order.
      stop_token_ids: stop after generating any of these tokens.
      ignore_eos: do not stop at the model's EOS ids (stop_token_ids still stop).
      stop: stop strings (one str or several; needs a tokenizer). The output text is cut before
        the first one found and the finish reason is "stop"; the token ids keep every generated
        token, the one that completed the stop string included (vLLM's semantics).
      logprobs: None for none; k (0 to MAX_LOGPROBS) returns, for every generated token, the
        log-probability of the sampled token and of the k most likely tokens, computed on the
        device from the model's raw next-token distribution (log-softmax of the logits before
        temperature, top-k/top-p and min_tokens masking).
      presence_penalty: OpenAI's: subtracted from the logit of every token the OUTPUT holds
        already (once, however often); in [-2, 2], 0 means none. Positive values push towards
        new tokens.
      frequency_penalty: OpenAI's: subtracted from the logit of every token once per time the
        OUTPUT holds it already; in [-2, 2], 0 means none.
      repetition_penalty: HF's / vLLM's: every token that occurs in the PROMPT or the output has
        its logit divided by it when positive, multiplied by it otherwise; > 0, 1 means none.
        The three penalties apply on the device before the min_tokens mask, temperature,
        top-k/top-p and the greedy argmax (repetition first, then frequency and presence, as
        vLLM); `logprobs` stay those of the raw distribution.
      structured: what the output must match (`StructuredOutput`: a JSON
        schema, any JSON object, a regex, a choice or a Lark grammar); None: anything. Each
        token is sampled under the grammar's allowed-token mask, applied on the device after
        the penalties; the output ends with an EOS id once the grammar is complete (so neither
        `ignore_eos` nor `min_tokens` combine with it), or at max_tokens ("length": cut short).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        max_tokens = checks.integer("max_tokens", self.max_tokens, low=1)
        checked = {
            "temperature": checks.real("temperature", self.temperature, low=0.0),
            "top_k": checks.integer("top_k", self.top_k, low=0),  # 0 disables top-k
            "top_p": checks.real("top_p", self.top_p, low=0.0, high=1.0, low_open=True),
            "max_tokens": max_tokens,
            "min_tokens": checks.integer("min_tokens", self.min_tokens, low=0, high=max_tokens),
            "seed": None
            if self.seed is None
            else checks.integer("seed", self.seed, low=0, high=2**32 - 1),
            "stop_token_ids": tuple(checks.token_ids("stop_token_ids", self.stop_token_ids)),
            "ignore_eos": checks.flag("ignore_eos", self.ignore_eos),
            "stop": checks.strings("stop", self.stop),
            "logprobs": None
            if self.logprobs is None
            else checks.integer("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS),
            **self._checked_penalties(),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # normalised: numpy scalars become Python's
        self._check_structured()

    def _check_structured(self) -> None:
        """ValueError unless `structured` is None or a `StructuredOutput` the other options
        leave room for (the grammar ends the output with an EOS id)."""
        if self.structured is None:
            return
        if not isinstance(self.structured, StructuredOutput):
            raise ValueError(f"structured={self.structured!r} must be a StructuredOutput or None")
        if self.ignore_eos:
            raise ValueError("ignore_eos=True with structured: the grammar ends at an EOS id")
        if self.min_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} with structured: the grammar decides the length"
            )

    def _checked_penalties(self) -> dict[str, float]:
        """The three penalties, checked: additive ones in [-2, 2], the repetition one > 0."""
        bound = MAX_ADDITIVE_PENALTY
        return {
            "presence_penalty": checks.real(
                "presence_penalty", self.presence_penalty, low=-bound, high=bound
            ),
            "frequency_penalty": checks.real(
                "frequency_penalty", self.frequency_penalty, low=-bound, high=bound
            ),
            "repetition_penalty": checks.real(
                "repetition_penalty", self.repetition_penalty, low=0.0, low_open=True
            ),
        }

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def is_penalized(self) -> bool:
        """Some penalty changes logits (a request without one pays nothing for them)."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
