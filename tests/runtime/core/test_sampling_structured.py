"""`SamplingParams.structured`: a `StructuredOutput` or None, and never with the options that
would fight the grammar's end (an EOS id)."""

from __future__ import annotations

import pytest

from runtime.core.sampling_params import SamplingParams
from runtime.core.structured_output import StructuredOutput

CHOICE = StructuredOutput(choice=("a", "b"))


def test_structured_defaults_to_none_and_keeps_a_spec():
    assert SamplingParams().structured is None
    assert SamplingParams(structured=CHOICE).structured == CHOICE


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"structured": {"choice": ["a"]}}, "must be a StructuredOutput"),
        ({"structured": CHOICE, "ignore_eos": True}, "ignore_eos"),
        ({"structured": CHOICE, "min_tokens": 2}, "min_tokens"),
    ],
)
def test_conflicting_options_are_refused(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_a_schema_is_kept_as_text_in_its_own_order():
    """A dict schema and its JSON text are one spec (one compiled grammar), keys in order."""
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}
    spec = StructuredOutput(json=schema)
    assert spec == StructuredOutput(
        json='{"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}'
    )
    assert spec.json is not None and spec.json.index('"b"') < spec.json.index('"a"')
