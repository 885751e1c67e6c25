"""`Startup`: a server that listens before its model is ready.

The socket is bound and the routes answer from the first moment; the model loads in a thread of
its own, then the engine thread compiles the warm-up variants. Until both are done `/health`
answers 503 (its stage, "loading" or "compiling", and while compiling its progress: programs
ready of the total, loaded and compiled, seconds) and every `/v1` request a 503 with
`Retry-After`; a load that fails is reported (`on_failure`: the command stops the server and
exits with the error); a failed compile or step retires the engine (`/health` says why).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from runtime.llm import LLM
from runtime.serve.async_engine import AsyncEngine, EngineError
from runtime.serve.errors import Unavailable
from runtime.serve.intake import Intake
from runtime.serve.limits import Limits
from runtime.serve.metrics import Metrics
from runtime.serve.tool_parsers import NoToolParser, ToolParser

log = logging.getLogger(__name__)

STARTING_RETRY_SECONDS = 5  # a warm-up takes seconds to minutes: no point asking sooner
_DOING = {"loading": "loading the model", "compiling": "compiling its step variants"}


class Startup:
    """The model's way from loading to serving, and what the routes may use meanwhile.

    Attributes:
      llm, engine, intake: the loaded model, its engine thread and the front door (None while
        the model loads).
      failure: what failed the load, the warm-up or a step (None while all is well).
    """

    def __init__(
        self,
        load: Callable[[], LLM],
        warmup: Callable[[LLM], None] | None,
        limits: Limits,
        metrics: Metrics,
        model_name: str,
        on_failure: Callable[[BaseException], None] | None = None,
        tool_parser: ToolParser | None = None,
    ) -> None:
        self._load, self._warmup, self._on_failure = load, warmup, on_failure
        self.tool_parser = tool_parser or NoToolParser()
        self.limits, self.metrics, self.model_name = limits, metrics, model_name
        self.llm: LLM | None = None
        self.engine: AsyncEngine | None = None
        self.intake: Intake | None = None
        self._load_failure: BaseException | None = None

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load the model in a thread, then start the engine thread (deltas go to `loop`)."""
        # A daemon: a signal may stop the server mid-load, and nothing of a load needs undoing.
        threading.Thread(target=self._start, args=(loop,), name="jmamba-load", daemon=True).start()

    def stop(self) -> None:
        """Stop the engine thread and the intake's workers (after the connections drained)."""
        if self.engine is not None:
            self.engine.stop()
        if self.intake is not None:
            self.intake.close()

    @property
    def failure(self) -> BaseException | None:
        if self._load_failure is not None:
            return self._load_failure
        return None if self.engine is None else self.engine.failure

    @property
    def stage(self) -> str:
        """ "loading", "compiling", "ready" or "failed"."""
        if self.failure is not None:
            return "failed"
        if self.engine is None:
            return "loading"
        return "ready" if self.engine.ready.is_set() else "compiling"

    def front_door(self) -> Intake:
        """The intake, once the server serves: 503 while starting, 500 once failed."""
        failure = self.failure
        if failure is not None:
            raise EngineError(f"the engine failed and serves no more (restart it): {failure}")
        stage = self.stage
        if self.intake is None or stage != "ready":
            raise Unavailable(
                f"the server is starting ({_DOING[stage]}): try again",
                STARTING_RETRY_SECONDS,
                "starting",
            )
        return self.intake

    def health(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        """`/health`'s status code, body and headers."""
        stage = self.stage
        if stage == "failed":
            return 503, {"status": "failed", "error": str(self.failure)}, {}
        if stage == "ready":
            return 200, {"status": "ok"}, {}
        retry = {"Retry-After": str(STARTING_RETRY_SECONDS)}
        body: dict[str, Any] = {"status": "starting", "stage": stage}
        if self.llm is not None:
            body["progress"] = self.llm.engine.snapshot().warmup
        return 503, body, retry

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            llm = self._load()
        except BaseException as error:  # reported, and the command exits with it
            log.debug("loading the model failed", exc_info=error)
            self._load_failure = error
            if self._on_failure is not None:
                self._on_failure(error)
            return
        engine = AsyncEngine(llm.engine)
        self.metrics.watch(engine)
        self.intake = Intake(
            llm, engine, self.limits, self.metrics, self.model_name, self.tool_parser
        )
        self.llm = llm
        warmup = self._warmup
        engine.start(loop, None if warmup is None else lambda: warmup(llm))
        self.engine = engine  # last: `stage` reads "compiling" only once the thread runs
