"""What a body asks its answer to match, as one `StructuredOutput` (or None: anything).

Two spellings, on both endpoints: OpenAI's `response_format` ({"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}, {"type": "json_object"} or {"type": "text"}) and
vLLM's `structured_outputs` extra field (exactly one of "json", "json_object", "regex",
"choice", "grammar", as vLLM's `StructuredOutputsParams`). A body with both, with vLLM's older
`guided_*` fields, or with a key or type the server does not know gets a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from runtime.core.structured_output import KINDS, StructuredOutput
from runtime.serve.errors import BadRequest

# vLLM's spellings before `structured_outputs` (removed in its 0.12): refused, not ignored.
LEGACY_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output(
    response_format: dict[str, Any] | None,
    structured_outputs: dict[str, Any] | None,
    legacy: dict[str, Any],
) -> StructuredOutput | None:
    """The constraint of a body's `response_format` or `structured_outputs` (`legacy`: its
    `guided_*` fields by name); None when it asks for none."""
    for name, value in legacy.items():
        if value is not None:
            key = name.removeprefix("guided_")
            raise BadRequest(
                f'{name} is not supported: send structured_outputs: {{"{key}": ...}}', name
            )
    from_format = _from_response_format(response_format)
    if structured_outputs is None:
        return from_format
    if from_format is not None:
        raise BadRequest(
            "send response_format or structured_outputs, not both", "structured_outputs"
        )
    return _from_structured_outputs(structured_outputs)


def _from_response_format(response_format: dict[str, Any] | None) -> StructuredOutput | None:
    """OpenAI's `response_format` as a constraint (None for "text" or none)."""
    if response_format is None:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _made("response_format", json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise BadRequest(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                "response_format",
            )
        return _made("response_format", json=schema)
    raise BadRequest(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
        "response_format",
    )


def _from_structured_outputs(fields: dict[str, Any]) -> StructuredOutput:
    """vLLM's `structured_outputs` as a constraint."""
    unknown = sorted(set(fields) - set(KINDS))
    if unknown:
        raise BadRequest(
            f"structured_outputs {unknown} are not supported (one of {', '.join(KINDS)})",
            "structured_outputs",
        )
    options = dict(fields)
    if isinstance(options.get("choice"), list):
        options["choice"] = tuple(options["choice"])
    return _made("structured_outputs", **options)


def _made(param: str, **options: Any) -> StructuredOutput:
    """A `StructuredOutput`, its ValueError a 400 naming `param`."""
    try:
        return StructuredOutput(**options)
    except (ValueError, TypeError) as error:
        raise BadRequest(str(error), param) from None
