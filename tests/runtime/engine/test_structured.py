"""Structured outputs through the engine (tiny-stdlib: its text is noise, so only the grammar
makes it valid): every constrained answer parses and validates, greedy and sampled, with and
without ngram drafts, asynchronous scheduling and multi-step decode on; unconstrained rows
beside them get the greedy tokens they get alone (docs/architecture.md section 5, invariant 8)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from runtime import LLM, SamplingParams
from runtime.core.structured_output import StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "size", "ok"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)"
CHOICES = ("red", "green", "blue")
PROMPTS = ["def ", "import os\n", "class A:\n    ", "for i in "]


def is_valid(spec: StructuredOutput, text: str) -> bool:
    """Whether `text` is what `spec` asks for."""
    if spec.json is not None:
        jsonschema.validate(json.loads(text), json.loads(str(spec.json)))
        return True
    if spec.json_object:
        return isinstance(json.loads(text), dict)
    if spec.regex is not None:
        return re.fullmatch(spec.regex, text) is not None
    return spec.choice is not None and text in spec.choice


SPECS = [
    StructuredOutput(json=SCHEMA),
    StructuredOutput(regex=REGEX),
    StructuredOutput(choice=CHOICES),
    StructuredOutput(json_object=True),
]


@pytest.fixture(scope="module")
def llm() -> LLM:
    """tiny-stdlib with asynchronous scheduling, 4 decode steps a program and ngram drafts in
    steps of at most 4 running requests (larger ones run without drafts); one bucket per kind
    and one sampler program, so few programs compile."""
    return LLM(
        "tiny-stdlib",
        max_num_seqs=8,
        max_model_len=160,
        max_num_batched_tokens=128,
        decode_row_buckets=(8,),
        prefill_token_buckets=(128,),
        prefill_row_buckets=(8,),
        prefix_caching="off",
        one_sampler_program=True,
        freeze_gc=False,
        speculative={"method": "ngram", "num_speculative_tokens": 3, "max_batch_size": 4},
    )


def constrained(temperature: float) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=80, temperature=temperature, seed=i, structured=spec)
        for i, spec in enumerate(SPECS)
    ]


def test_constrained_answers_validate_and_leave_the_others_alone(llm: LLM):
    plain = SamplingParams(max_tokens=24)
    alone = llm.generate(PROMPTS, plain, use_tqdm=False)
    params = [plain] * len(PROMPTS) + constrained(0.0) + constrained(1.0)
    prompts = PROMPTS + PROMPTS[: len(SPECS)] * 2
    mixed = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in mixed[: len(PROMPTS)]] == [o.token_ids for o in alone]
    for output, spec in zip(mixed[len(PROMPTS) :], SPECS * 2, strict=True):
        assert output.finish_reason == "stop", output.text
        assert is_valid(spec, output.text), output.text


def test_drafts_are_checked_against_the_grammar(llm: LLM):
    """Prompts holding the answer's shape make ngram drafts for the constrained rows (few rows:
    the steps draft); drafts the grammar refuses are rejected, and every answer validates."""
    example = '{"name":"bob","size":12,"ok":true} {"name":"bob","size":1'
    before = llm.stats.speculation.num_drafted
    params = constrained(0.0)[:2] + constrained(1.0)[:2]
    prompts = [example, "bob@home.org bob@home.", example, "bob@home.org bob@home."]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats.speculation.num_drafted > before
    for output, spec in zip(outputs, SPECS[:2] * 2, strict=True):
        assert output.finish_reason == "stop" and is_valid(spec, output.text), output.text
