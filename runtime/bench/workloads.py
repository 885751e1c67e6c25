"""The sessions a benchmark runs: each a list of turns, run one after another; a turn's prompt is
the session's earlier prompts and answers followed by its own text (single-turn workloads have
one turn). Texts are made of random lowercase words, so they mean nothing but tokenize like text.

- `random`: ShareGPT-like lengths: prompt and answer lengths log-normal around the medians given
  (heavy-tailed, as ShareGPT's conversations are), clipped to fit the model;
- `shared-prefix`: every prompt starts with one of a few long shared texts (a system prompt,
  few-shot examples), then its own question;
- `chat`: multi-turn conversations, each turn's prompt holding the earlier turns and answers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

WORKLOADS = ("random", "shared-prefix", "chat")
CHARS_PER_WORD = 6  # a word of 2-8 letters and a space


@dataclasses.dataclass(frozen=True)
class Turn:
    """One request of a session: its own text (after the session's history) and answer length."""

    text: str
    max_tokens: int


@dataclasses.dataclass(frozen=True)
class Session:
    turns: list[Turn]


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What to generate.

    Attributes:
      name: one of WORKLOADS.
      num_requests: requests in all (chat: turns in all, `turns` a conversation).
      prompt_chars / answer_tokens: medians of a prompt's own text (characters) and of an answer.
      max_chars / max_answer: the caps that keep a request inside the model's context.
      turns: turns per chat conversation.
      num_prefixes / prefix_chars: shared-prefix texts and their length.
    """

    name: str
    num_requests: int
    prompt_chars: int = 200
    answer_tokens: int = 64
    max_chars: int = 1000
    max_answer: int = 256
    turns: int = 3
    num_prefixes: int = 4
    prefix_chars: int = 600

    @classmethod
    def within(
        cls,
        name: str,
        num_requests: int,
        max_model_len: int,
        *,
        prompt_chars: int = 200,
        answer_tokens: int = 64,
        turns: int = 3,
    ) -> WorkloadSpec:
        """A workload whose every request fits `max_model_len` tokens (a character is at most a
        token): each chat turn's own text and answer get an equal share of the context, a prompt
        at most half of it, an answer and a shared prefix a quarter."""
        turns = turns if name == "chat" else 1
        room = max_model_len // turns
        return cls(
            name=name,
            num_requests=num_requests,
            prompt_chars=min(prompt_chars, room // 2),
            answer_tokens=min(answer_tokens, room // 4),
            max_chars=room // 2,
            max_answer=room // 4,
            turns=turns,
            prefix_chars=room // 4,
        )


def sessions(spec: WorkloadSpec, seed: int) -> list[Session]:
    """The sessions of `spec`, drawn from `seed`."""
    if spec.name not in WORKLOADS:
        raise ValueError(f"workload={spec.name!r} must be one of {WORKLOADS}")
    rng = np.random.default_rng(seed)
    if spec.name == "chat":
        count = max(spec.num_requests // spec.turns, 1)
        return [Session([_turn(spec, rng) for _ in range(spec.turns)]) for _ in range(count)]
    prefixes = [words(rng, spec.prefix_chars) for _ in range(spec.num_prefixes)]
    result = []
    for _ in range(spec.num_requests):
        turn = _turn(spec, rng)
        if spec.name == "shared-prefix":
            prefix = prefixes[int(rng.integers(len(prefixes)))]
            turn = dataclasses.replace(turn, text=prefix + turn.text)
        result.append(Session([turn]))
    return result


def _turn(spec: WorkloadSpec, rng: np.random.Generator) -> Turn:
    chars = _lognormal(rng, spec.prompt_chars, 8, spec.max_chars)
    answer = _lognormal(rng, spec.answer_tokens, 1, spec.max_answer)
    return Turn(words(rng, chars), answer)


def _lognormal(rng: np.random.Generator, median: int, low: int, high: int) -> int:
    """A heavy-tailed length around `median` (sigma 0.8, about ShareGPT's spread), in [low,
    high]."""
    return int(np.clip(round(median * rng.lognormal(0.0, 0.8)), low, high))


def words(rng: np.random.Generator, num_chars: int) -> str:
    """About `num_chars` characters of random lowercase words."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out: list[str] = []
    length = 0
    while length < num_chars:
        word = "".join(rng.choice(letters, int(rng.integers(2, 9))))
        out.append(word)
        length += len(word) + 1
    return " ".join(out) + " "
