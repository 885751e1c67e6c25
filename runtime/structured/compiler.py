"""`GrammarCompiler`: one engine's grammars, compiled once per spec, and a matcher per request.

llguidance reads the engine's own `tokenizers.Tokenizer` (its vocabulary as bytes: built on the
first structured request, 1-2 s for a 150k vocabulary). Each spec's grammar is compiled once
(a fresh `LLMatcher`, kept in a least-recently-used cache of `CACHE_SIZE`); a request's matcher
is a copy of it, which costs far less than compiling.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import llguidance

from runtime.core.structured_output import StructuredOutput
from runtime.structured.matcher import GrammarMatcher

CACHE_SIZE = 64  # compiled grammars kept (a server's requests mostly repeat a few schemas)


class GrammarCompiler:
    """Compiles `StructuredOutput` specs for one tokenizer and hands out `GrammarMatcher`s."""

    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...]) -> None:
        """`tokenizer`: a `tokenizers.Tokenizer`; `eos_token_ids`: the model's, which end every
        structured output (ValueError if there are none)."""
        if not eos_token_ids:
            raise ValueError("structured outputs need the model's EOS id to end the output")
        backend = copy.copy(tokenizer)
        backend.no_padding()
        backend.no_truncation()
        self.eos_token_ids = eos_token_ids
        self.tokenizer = llguidance.LLTokenizer(backend.to_str(), eos_token=list(eos_token_ids))
        self._compiled: collections.OrderedDict[StructuredOutput, llguidance.LLMatcher] = (
            collections.OrderedDict()
        )

    def matcher(self, spec: StructuredOutput) -> GrammarMatcher:
        """A fresh matcher of `spec`'s grammar (compiled now unless cached); ValueError if
        llguidance refuses the grammar for this tokenizer."""
        compiled = self._compiled.pop(spec, None)
        if compiled is None:
            compiled = llguidance.LLMatcher(self.tokenizer, spec.grammar_text(), log_level=0)
            if compiled.is_error():
                raise ValueError(f"structured output {spec.kind}: {compiled.get_error()}")
        self._compiled[spec] = compiled
        while len(self._compiled) > CACHE_SIZE:
            self._compiled.popitem(last=False)
        vocab_size = self.tokenizer.vocab_size
        return GrammarMatcher(compiled.deep_copy(), vocab_size, self.eos_token_ids)
