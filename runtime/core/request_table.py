"""`RequestTable`: an engine's live requests by id, the rank each was placed on, and how new ones
get their ids and seeds (no jax)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from jmamba.config import ModelConfig
from runtime.core import checks
from runtime.core.config import EngineConfig
from runtime.core.request import Request, checked_request
from runtime.core.sampling_params import SamplingParams

SEED_STRIDE = 1_000_003  # engine seed * stride + arrival number: distinct seeds per engine seed


class RequestTable:
    """Live (waiting or running) requests of one engine process.

    A request without an id of its own is named by its arrival number, counted over accepted
    requests only, so a rejected request changes neither the names nor the seeds of later ones.
    A request without a seed of its own gets `engine seed * SEED_STRIDE + arrival number`.
    """

    def __init__(
        self, seed: int, eos_token_ids: tuple[int, ...], vocab_size: int, max_model_len: int
    ) -> None:
        self.seed = seed
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._requests: dict[str, Request] = {}
        self._ranks: dict[str, int] = {}
        self._counter = itertools.count()

    @classmethod
    def of(cls, config: EngineConfig, model_config: ModelConfig) -> RequestTable:
        """The table of an engine with `config` serving a model of `model_config`."""
        return cls(
            config.seed, model_config.eos_token_ids, model_config.vocab_size, config.max_model_len
        )

    def check(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None
    ) -> tuple[list[int], SamplingParams]:
        """(prompt as a list of ints, sampling params); ValueError naming what is wrong
        (`runtime.core.request.checked_request`)."""
        return checked_request(
            prompt_token_ids,
            sampling_params,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
        )

    def new(
        self, prompt: list[int], params: SamplingParams, request_id: str | int | None
    ) -> Request:
        """A request for a checked prompt and params; ValueError if its id is in use."""
        given = None if request_id is None else checks.request_id(request_id)
        if given in self._requests:
            raise ValueError(f"request_id={given!r} is already in use")
        number = next(self._counter)
        name = str(number) if given is None else given
        if name in self._requests:
            raise ValueError(f"request_id={name!r} (from the arrival count) is in use")
        seed = params.seed if params.seed is not None else self.seed * SEED_STRIDE + number
        return Request(name, prompt, params, seed=seed % 2**32, eos_token_ids=self.eos_token_ids)

    def add(self, request: Request, rank: int) -> None:
        """Hold `request`, placed on the local rank `rank`."""
        self._requests[request.request_id] = request
        self._ranks[request.request_id] = rank

    def get(self, request_id: str | int) -> Request:
        """The live request with this id; ValueError if there is none."""
        request_id = checks.request_id(request_id)
        if request_id not in self._requests:
            raise ValueError(f"request_id={request_id!r} is not a live request of this engine")
        return self._requests[request_id]

    def rank_of(self, request_id: str | int) -> int:
        """The local rank of the live request with this id; ValueError if there is none."""
        return self._ranks[self.get(request_id).request_id]

    def local_rank(self, request_id: str) -> int | None:
        """The local rank (index into the engine's schedulers) of a live request, else None."""
        return self._ranks.get(request_id)

    def live(self) -> list[Request]:
        """Every live request, in arrival order."""
        return list(self._requests.values())

    def remove(self, request_id: str) -> None:
        del self._requests[request_id]
        del self._ranks[request_id]

    def __len__(self) -> int:
        return len(self._requests)
