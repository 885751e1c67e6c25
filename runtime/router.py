"""`Router`: which data-parallel rank serves a new request.

A rank is a scheduler with its own pools; once placed, a request stays on its rank (its KV blocks
and state slot live in that rank's shard), preemption and recompute included. The default policy
sends a request to the rank with the least outstanding work, counted in tokens still to compute
(prompt tokens not yet prefilled plus output tokens not yet generated, over waiting and running
requests), ties to the lowest rank. Any object with `place(request, schedulers) -> index` can
replace it (round robin, prefix-cache affinity, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runtime.core.request import Request
from runtime.core.scheduler import Scheduler


class Router(Protocol):
    def place(self, request: Request, schedulers: Sequence[Scheduler]) -> int:
        """Index into `schedulers` of the rank that will serve `request`."""
        ...


def outstanding_tokens(scheduler: Scheduler) -> int:
    """Tokens a rank still has to compute for the requests it holds (upper bound on outputs)."""
    return sum(r.num_tokens_left for r in (*scheduler.waiting, *scheduler.running))


class LeastOutstandingWork:
    """Place each request on the rank with the fewest outstanding tokens (lowest rank on ties)."""

    def place(self, request: Request, schedulers: Sequence[Scheduler]) -> int:
        loads = [outstanding_tokens(s) for s in schedulers]
        return loads.index(min(loads))
