"""`StepInputs` as a jax pytree: the dataclasses of `jmamba.step.inputs`, registered on import.

The model, the mixers and the runtime's device side import `StepInputs` from here, so the classes
are registered before any jitted function sees them. The host side (the runtime's builder)
imports `jmamba.step.inputs` instead and never loads jax (docs/architecture.md section 3).
"""

from __future__ import annotations

import jax

from jmamba.step.inputs import NULL, DecodeRows, NextTokens, PrefillRows, StepInputs

__all__ = ["NULL", "Array", "DecodeRows", "NextTokens", "PrefillRows", "StepInputs"]

Array = jax.Array | jax.typing.ArrayLike


def _register() -> None:
    """Register the four classes (once per process; `importlib.reload` must not register twice)."""
    for cls in (DecodeRows, PrefillRows, NextTokens, StepInputs):
        try:
            jax.tree_util.register_dataclass(cls)
        except ValueError as error:  # already registered by an earlier import of this module
            if "Duplicate" not in str(error):
                raise


_register()
