"""`StructuredOutput`: what one request's output must match (vLLM's `structured_outputs`).

Exactly one of `json` (a JSON schema), `json_object`, `regex`, `choice` or `grammar` (Lark, as
llguidance reads it) is set. The spec is checked when it is made: its llguidance grammar must
compile (`grammar_text`), so a bad schema or regex is a ValueError at the request's entry, never
a failure inside a step. A spec is hashable (a schema is kept as JSON text): the
engine's `GrammarCompiler` caches one compiled grammar per spec.
"""

from __future__ import annotations

import dataclasses
import json as json_text
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# Compact JSON ("," and ":" separators, no whitespace between tokens): a model cannot stall in
# whitespace, and the text still parses with any JSON reader.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


@dataclasses.dataclass(frozen=True)
class StructuredOutput:
    """One request's output constraint (exactly one field set).

    Attributes:
      json: a JSON schema (a dict, or its JSON text; kept as text); the output is one
        JSON value valid against it, written compact.
      json_object: the output is one JSON object (any keys and values).
      regex: the output matches this regular expression (Rust `regex` syntax) in full.
      choice: the output is exactly one of these strings.
      grammar: the output is a sentence of this Lark grammar (llguidance's dialect).
    """

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        set_fields = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(set_fields) != 1:
            raise ValueError(
                f"structured output needs exactly one of {', '.join(KINDS)}; got "
                f"{set_fields or 'none'}"
            )
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json))
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice))
        for kind in ("regex", "grammar"):
            value = getattr(self, kind)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured output {kind}={value!r} must be a non-empty str")
        error = llguidance.LLMatcher.validate_grammar(self.grammar_text())
        if error:
            raise ValueError(f"structured output {self.kind}: {error.strip()}")

    @property
    def kind(self) -> str:
        """The field that is set: "json", "json_object", "regex", "choice" or "grammar"."""
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    def grammar_text(self) -> str:
        """The llguidance grammar of this spec (what `LLMatcher` compiles)."""
        matcher = llguidance.LLMatcher
        if self.json is not None or self.json_object:
            schema = self.json if self.json is not None else '{"type": "object"}'
            return matcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        if self.regex is not None:
            return matcher.grammar_from_regex(self.regex)
        if self.choice is not None:  # Lark string literals are JSON strings
            return matcher.grammar_from_lark(
                "start: " + " | ".join(json_text.dumps(c) for c in self.choice)
            )
        return matcher.grammar_from_lark(str(self.grammar))


def _schema_text(schema: str | dict[str, Any]) -> str:
    """A JSON schema as canonical JSON text (sorted keys); ValueError unless it is an object."""
    if isinstance(schema, str):
        try:
            schema = json_text.loads(schema)
        except json_text.JSONDecodeError as error:
            raise ValueError(f"structured output json is not JSON: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"structured output json={schema!r} must be a JSON schema object")
    return json_text.dumps(schema)  # its own key order: properties come out in it


def _choices(choice: Any) -> tuple[str, ...]:
    """The choices as a tuple of non-empty strs; ValueError otherwise."""
    if isinstance(choice, str) or not all(isinstance(c, str) and c for c in choice) or not choice:
        raise ValueError(f"structured output choice={choice!r} must be non-empty strs (a list)")
    return tuple(choice)
