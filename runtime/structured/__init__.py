"""Structured outputs, the feature: each spec's grammar compiled once per engine
(`GrammarCompiler`, llguidance) and each request's matcher (`GrammarMatcher`), which fills its
rows of the step's allowed-token bitmask on the host; the sampler applies that bitmask on the
device (`runtime.device.sampler`). What a request asks for, `StructuredOutput`, is vocabulary in
`runtime.core.structured_output` (`from runtime import StructuredOutput`)."""

from runtime.structured.compiler import GrammarCompiler
from runtime.structured.matcher import GrammarMatcher

__all__ = ["GrammarCompiler", "GrammarMatcher"]
