"""The draft gate (`runtime.speculative.gate`): which steps draft.

`MeasuredGate` is driven here by a simulated engine whose two kinds of step yield known rates, so
what it chooses can be checked exactly; the engine tests check that an adaptive engine's tokens
equal the naive greedy loop's whatever the gate chose.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from runtime import engine as engine_module
from runtime.core.engine_args import EngineArgs
from runtime.core.speculative_config import SpeculativeConfig
from runtime.engine import Engine
from runtime.serve.metrics import _EngineCollector
from runtime.speculative.gate import BatchLimit, MeasuredGate, draft_gate
from tests.runtime.speculative.spec_support import assert_serves_naive_greedy, spec_engine
from tests.runtime.speculative.test_speculative import assert_pools_empty
from tests.tiers import slow


def run(gate: MeasuredGate, steps: int, num_running: int, rate: dict[bool, float]) -> list[bool]:
    """`steps` steps at `num_running` requests, each retiring `rate[kind]` tokens in 1 s; the
    kinds the gate chose."""
    kinds = []
    for _ in range(steps):
        kind = gate.drafts(num_running)
        gate.observe(int(rate[kind]), 1.0, kind)
        kinds.append(kind)
    return kinds


def test_batch_limit_drafts_up_to_its_size():
    assert [BatchLimit(2).drafts(n) for n in (1, 2, 3)] == [True, True, False]
    assert not BatchLimit(0).drafts(1) and not BatchLimit(0).drafts(0)


def test_the_gate_each_config_asks_for():
    assert draft_gate(EngineArgs()) == BatchLimit(0)
    spec = SpeculativeConfig("mtp", 2)
    assert draft_gate(EngineArgs(speculative=spec)) == BatchLimit(sys.maxsize)
    limited = SpeculativeConfig("mtp", 2, max_batch_size=8)
    assert draft_gate(EngineArgs(speculative=limited)) == BatchLimit(8)
    adaptive = SpeculativeConfig("ngram", 2, adaptive=True)
    gate = draft_gate(EngineArgs(speculative=adaptive, decode_row_buckets=(1, 4, 16)))
    assert isinstance(gate, MeasuredGate) and gate.classes == (1, 4, 16)


@pytest.mark.parametrize("gate", [BatchLimit(0), BatchLimit(4), MeasuredGate((4,))])
def test_only_the_answer_of_a_gate_that_is_not_uniform_is_agreed(monkeypatch, gate):
    """Every step agrees on the batch size across processes; a gate that answers from the batch
    size alone (`uniform`) is not agreed again: a multi-host run without speculation, or with a
    batch limit, runs one collective per step for it, not two."""
    agreed = []
    monkeypatch.setattr(engine_module, "agree_max_int", lambda x: agreed.append([int(x)]) or x)
    local = SimpleNamespace(schedulers=[SimpleNamespace(running=[1, 2, 3])], gate=gate)
    drafts = Engine._drafts_now(local)
    # 3 running: BatchLimit(4) drafts, and so does a measured gate's first window
    assert drafts == (gate != BatchLimit(0))
    assert agreed == ([[3]] if gate.uniform else [[3], [int(drafts)]])
    assert gate.uniform == isinstance(gate, BatchLimit)


def test_adaptive_needs_a_drafter_that_can_skip_steps():
    with pytest.raises(ValueError, match="adaptive=True needs method 'ngram' or 'mtp'"):
        SpeculativeConfig("draft_model", 2, adaptive=True)
    with pytest.raises(ValueError, match="adaptive=1 must be True or False"):
        SpeculativeConfig("ngram", 2, adaptive=1)


@pytest.mark.parametrize("drafting_pays", [True, False])
def test_measures_both_kinds_then_runs_the_faster(drafting_pays):
    """A drafting window and a plain one, then the faster kind; the slower one runs again after
    4, 8, 16, 16 ... windows (the interval doubles while the answer holds, up to 16)."""
    gate = MeasuredGate((1, 16), window=2, first_interval=4, max_interval=16)
    rate = {True: 30.0, False: 20.0} if drafting_pays else {True: 10.0, False: 20.0}
    kinds = run(gate, 2 * 60, 8, rate)
    windows = kinds[::2]
    assert kinds[1::2] == windows  # a window is one kind
    assert windows[:2] == [True, False]  # each kind measured once
    checks = [i for i, kind in enumerate(windows) if i >= 2 and kind != drafting_pays]
    assert checks == [6, 15, 32, 49]  # after 4, 8, 16, 16 windows of the faster kind
    assert gate.chooses(8) is drafting_pays


def test_a_change_in_what_pays_is_followed():
    """Drafting pays, then stops paying (acceptance fell): the next check finds it (a winner's
    own windows cannot tell a worse choice from a slower host), and the gate runs plain steps
    from then on, checking again soon."""
    gate = MeasuredGate((16,), window=2, first_interval=2, max_interval=8)
    run(gate, 2 * 20, 8, {True: 30.0, False: 20.0})
    assert gate.chooses(8) is True
    windows = run(gate, 2 * 40, 8, {True: 5.0, False: 20.0})[::2]
    assert gate.chooses(8) is False
    assert windows.index(False) <= 8 + 1  # the next check (at most max_interval windows on)
    assert windows[10:].count(True) <= 4  # then drafting only in checks (2, 4, 8, 8 apart)
    assert windows[-3:] == [False] * 3


def test_each_batch_class_decides_alone():
    """Drafting pays at 1 request and not at 16: each class measures its own."""
    gate = MeasuredGate((1, 16), window=2)
    for _ in range(10):
        run(gate, 4, 1, {True: 30.0, False: 20.0})
        run(gate, 4, 12, {True: 10.0, False: 20.0})
    assert gate.chooses(1) is True and gate.chooses(12) is False
    assert gate.chooses(40) is False  # past the largest class: the largest class's answer


def test_a_window_cut_by_a_class_change_is_not_measured():
    gate = MeasuredGate((1, 16), window=4)
    run(gate, 3, 1, {True: 1000.0, False: 1.0})  # three steps of a four-step window
    run(gate, 9, 12, {True: 1.0, False: 2.0})  # a window is measured as the next one opens
    assert gate.measured[1].ratio is None
    assert gate.measured[16].ratio == 0.5


def test_a_windows_first_step_is_not_its_own():
    """The first step of a window retires what the window before left in flight (or nothing):
    it is left out of the window's rate."""
    gate = MeasuredGate((16,), window=4)
    rate = {True: 30.0, False: 20.0}
    for step in range(2 * 4 + 1):
        kind = gate.drafts(8)
        gate.observe(1000 if step % 4 == 0 else int(rate[kind]), 1.0, kind)
    assert gate.measured[16].ratio == 1.5


def test_a_window_with_a_step_of_the_other_kind_is_not_measured():
    """In a multi-host run a step drafts when any process's gate asks: a window in which the
    agreed kind was not the gate's own is left out."""
    gate = MeasuredGate((16,), window=2)
    for step in range(2 * 3 + 1):
        kind = gate.drafts(8)
        overruled = step == 3  # the second (plain) window: another process asked for drafts
        gate.observe(10, 1.0, kind or overruled)
    assert gate.measured[16].ratio is None  # draft, (spoiled), draft: no adjacent pair yet
    run(gate, 2 * 2, 8, {True: 10.0, False: 20.0})
    assert gate.measured[16].ratio == 0.5


def test_a_window_without_decode_tokens_is_not_measured():
    """Steps of prefill chunks only retire no decode token: no rate, and no division by it."""
    gate = MeasuredGate((16,), window=2)
    run(gate, 2 * 2 + 1, 8, {True: 10.0, False: 0.0})
    assert gate.measured[16].ratio is None
    run(gate, 2 * 2, 8, {True: 10.0, False: 20.0})
    assert gate.measured[16].ratio == 0.5


def test_never_drafts_above_max_batch_size_or_without_requests():
    gate = MeasuredGate((1, 16), max_batch_size=4, window=1)
    assert not any(run(gate, 10, 5, {True: 100.0, False: 1.0}))
    assert not gate.drafts(0)
    assert gate.measured == {}


@slow
def test_an_adaptive_engine_serves_the_naive_greedy_tokens():
    """Whatever the gate chooses step by step (plain steps and drafting ones, all asynchronous
    with the MTP head; the hypothesis schedules draw random gates with every drafter), every
    request's tokens equal the naive greedy loop's, the gate measured both kinds at the batch
    sizes it saw long enough, and the stats and /metrics count the steps that drafted. Windows
    of 3 steps: the random head's drafts are all rejected, so the row after a drafting step is
    stale and the first counted step of a plain window retires nothing."""
    family = "nemotron_h"
    engine = spec_engine(family, "mtp", 2, async_scheduling=True, adaptive=True)
    engine.gate.window = 3
    prompts = [[3, 4, 3, 4, 3, 4, 3], [7, 8, 9, 7, 8, 9], [5, 5, 5, 5], [1, 2, 3]]
    lengths = [12, 20, 24, 16]
    assert_serves_naive_greedy(engine, family, prompts, lengths)
    assert any(measured.ratio is not None for measured in engine.gate.measured.values())
    assert 0 < engine.stats.num_drafting_steps < engine.stats.num_steps
    scraped = _EngineCollector(SimpleNamespace(engine=engine, step_seconds=0.0)).collect()
    counters = {metric.name: metric.samples[0].value for metric in scraped}
    assert counters["jmamba_spec_drafting_steps"] == engine.stats.num_drafting_steps
    assert_pools_empty(engine)
