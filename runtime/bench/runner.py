"""Run a workload's sessions against a target: at most `concurrency` sessions at once, or
sessions starting at a Poisson `request_rate` (per second) with no cap. The turns of a session run
one after another, each prompt holding the session's earlier prompts and answers."""

from __future__ import annotations

import asyncio

import numpy as np

from runtime.bench.targets import Record, Target
from runtime.bench.workloads import Session


async def run_sessions(
    target: Target,
    sessions: list[Session],
    *,
    concurrency: int | None = None,
    request_rate: float | None = None,
    seed: int = 0,
) -> list[Record]:
    """Every turn's `Record`, in the order the turns finished."""
    records: list[Record] = []
    if concurrency is not None and request_rate is None:
        gate = asyncio.Semaphore(concurrency)

        async def held(session: Session) -> None:
            async with gate:
                await _run_session(target, session, records)

        await asyncio.gather(*(held(session) for session in sessions))
        return records
    if request_rate is None or concurrency is not None:
        raise ValueError("give one of concurrency and request_rate")
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, len(sessions))
    starts = np.cumsum(gaps) - gaps[0]

    async def at(delay: float, session: Session) -> None:
        await asyncio.sleep(delay)
        await _run_session(target, session, records)

    await asyncio.gather(*(at(float(d), s) for d, s in zip(starts, sessions, strict=True)))
    return records


async def _run_session(target: Target, session: Session, records: list[Record]) -> None:
    history = ""
    for turn in session.turns:
        prompt = history + turn.text
        record = await target.complete(prompt, turn.max_tokens)
        records.append(record)
        history = prompt + record.text + " "
