"""The step's input contract: `StepInputs` (jax-free, `inputs`), the same classes as jax pytrees
(`pytree`), the invariants every step's inputs keep (`invariants`), a plain prefill batch
(`prefill`) and a one-line description for logs (`describe`)."""
