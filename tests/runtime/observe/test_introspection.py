"""What notebooks look at: step records (a copy made at the step, not live requests), compile
time apart from run time, request lookup, block/slot owner maps, one-line reprs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jmamba.step.describe import describe_step_inputs
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from runtime.observe.describe import describe_pool, describe_scheduler
from tests.runtime.conftest import base_config, make_engine, model_and_runner


def test_records_are_snapshots_of_each_step(family):
    """Each record holds what its step scheduled, unchanged after the requests move on; its
    token count matches the step's inputs; at most step_records are kept."""
    engine = make_engine(family, step_records=3)
    first = engine.add_request(list(range(1, 21)), SamplingParams(max_tokens=4))
    second = engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    inputs_tokens = []
    while engine.has_unfinished:
        engine.step()
        live = int(np.asarray(engine.inspect.last_batch.inputs.decode.query_lens).sum())
        qsl = np.asarray(engine.inspect.last_batch.inputs.prefill.query_start_loc)
        inputs_tokens.append(live + int(qsl[-1]))
    records = list(engine.records)
    assert len(records) == 3 and [r.index for r in records] == [1, 2, 3]
    assert [r.num_tokens for r in records] == inputs_tokens[-3:]
    (schedule,) = records[-1].schedules
    assert [row.request_id for row in schedule.decodes] == [first]
    assert schedule.decodes[0].start == 20 + 2 and schedule.decodes[0].num_tokens == 1
    assert second in records[0].finished or second in records[1].finished
    assert records[-1].finished == (first,)
    assert all(r.bucket.num_decode_rows >= len(s.decodes) for r in records for s in r.schedules)


def test_first_step_of_each_variant_records_its_compile_time():
    """Compile seconds are counted apart: a variant's first step has them, later steps do not,
    and the stats' device seconds exclude them."""
    model, runner = model_and_runner("mamba2")
    fresh = type(runner)(model, runner.config)  # nothing compiled yet
    engine = Engine(model, base_config("mamba2"), runner=fresh)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    while engine.has_unfinished:
        engine.step()
    compiled = [r.compile_seconds > 0 for r in engine.records]
    assert compiled == [True, True, False]  # prefill variant, decode variant, decode again
    assert engine.stats.compile_seconds == pytest.approx(sum(fresh.compile_seconds.values()))
    assert engine.stats.device_seconds < engine.stats.compile_seconds
    assert "compile" in str(engine.records[0]) and "compile" not in str(engine.records[2])


def test_owner_maps_and_lookup_follow_the_pools(family):
    engine = make_engine(family)
    ids = [engine.add_request(list(range(1, n)), SamplingParams(max_tokens=3)) for n in (20, 9)]
    engine.step()
    blocks, slots = engine.inspect.block_owners(0), engine.inspect.slot_owners(0)
    for rid in ids:
        request = engine.request(rid)
        assert all(blocks[b] == [rid] for b in request.block_ids)
        assert (slots.get(request.state_slot) == rid) == engine.model_config.has_recurrent_state
    assert 0 not in blocks and 0 not in slots
    scheduler = engine.inspect.scheduler
    assert len(blocks) == scheduler.block_pool.num_used
    assert len(slots) == scheduler.slot_pool.num_used
    with pytest.raises(ValueError, match="rank=1 is not a rank of this process"):
        engine.inspect.block_owners(1)
    with pytest.raises(ValueError, match="request_id='nope' is not a live request"):
        engine.request("nope")
    while engine.has_unfinished:
        engine.step()
    assert engine.inspect.block_owners() == {} and engine.inspect.slot_owners() == {}


def test_reprs_are_one_informative_line():
    engine = make_engine("nemotron_h")
    rid = engine.add_request(list(range(1, 30)), SamplingParams(max_tokens=5))
    engine.step()
    texts = {
        "engine": repr(engine),
        "request": repr(engine.request(rid)),
        "pool": describe_pool(engine.inspect.scheduler.block_pool),
        "scheduler": describe_scheduler(engine.inspect.scheduler),
        "inputs": describe_step_inputs(engine.inspect.last_batch.inputs),
    }
    assert all("\n" not in text and len(text) < 300 for text in texts.values()), texts
    assert "NemotronHForCausalLM" in texts["engine"] and "running=1" in texts["engine"]
    assert texts["request"].startswith(f"Request({rid!r}, running, prompt=29, output=1/5")
    assert "computed=29" in texts["request"]
    assert "size=13, used=4, free=8" in texts["pool"] and f"running=[{rid!r}]" in texts["scheduler"]
    assert "1 live, lengths [29]" in texts["inputs"]


def test_step_records_off_keeps_none():
    engine = make_engine("mamba2", step_records=0)
    engine.add_request([1, 2], SamplingParams(max_tokens=2))
    while engine.has_unfinished:
        engine.step()
    assert list(engine.records) == [] and engine.stats.num_steps == 2
    assert dataclasses.replace(base_config("mamba2"), step_records=0).step_records == 0
