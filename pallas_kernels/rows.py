"""`Rows`: the ragged-rows-with-slots argument of every prefill op and of its reference.

A prefill call covers R rows over T flat tokens: row r owns tokens
`query_start_loc[r] : query_start_loc[r + 1]`, and tokens past `query_start_loc[R]` are padding
(their outputs are 0). Each row continues a request from the state in its read slot (or from
zeros), writes the state after its last token to its write slot and, with prefix caching, the
states at state-block boundaries inside it to boundary slots. Slots index the state pools inside
the kernels; a slot that is not live (<= 0, the NULL slot 0 and padding, or >= the pool's size)
reads zeros and writes nothing (docs/architecture.md section 5).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rows:
    """The prefill rows of one call and the state slots they read and write.

    A pytree whose leaves are the arrays and whose aux data is `block_size`. The kernels need the
    block size as a Python int (it decides at trace time where boundary states are stored), and an
    op is jitted with `rows` as an ordinary argument: a NamedTuple would turn the int into a
    traced leaf, and a separate static keyword would split one contract over two arguments that
    must agree. As aux data it stays static through `jax.jit` and a new block size compiles anew.

    Attributes:
      query_start_loc: [R + 1] int32, nondecreasing from 0: row r owns flat tokens
        query_start_loc[r]:query_start_loc[r + 1]; a padding row has length 0 (the offset
        repeats), tokens past query_start_loc[R] are padding.
      num_computed: [R] int32, tokens of the row's request processed before this call, i.e. the
        absolute position of its first token here. Chunks and state blocks end at absolute
        multiples of their size, so it places them inside the row. 0 for padding.
      has_initial_state: [R] bool, whether the row continues from the state in its read slot;
        False starts from zeros whatever the slot holds (pools are never zeroed). False for
        padding.
      read_slots: [R] int32, slot holding the row's initial state (and conv window); NULL for
        padding (a slot that is not live reads zeros).
      write_slots: [R] int32, slot receiving the state after the row's last token (a row of no
        tokens writes its initial state); NULL for padding (a slot that is not live writes
        nothing).
      boundary_slots: [R, NB] int32, or None without prefix caching. Column j of row r receives
        the state after the row's token at absolute position
        (num_computed[r] // block_size + j + 1) * block_size - 1, the j-th state-block boundary
        inside the row; NULL where no state is cached there, and columns past the row's end write
        nothing.
      block_size: (static) tokens per state block of `boundary_slots`, a multiple of the op's
        chunk size; None exactly when boundary_slots is None.
    """

    query_start_loc: jax.Array
    num_computed: jax.Array
    has_initial_state: jax.Array
    read_slots: jax.Array
    write_slots: jax.Array
    boundary_slots: jax.Array | None = None
    block_size: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @property
    def num_rows(self) -> int:
        return self.query_start_loc.shape[0] - 1

    def need_block_size(self) -> int:
        """`block_size`, which a call with boundary slots has (ValueError without them)."""
        if self.block_size is None:
            raise ValueError("these rows have no boundary slots, so no block_size")
        return self.block_size

    def int32_operands(self) -> tuple[jax.Array, ...]:
        """The kernels' operands: (query_start_loc, num_computed, has_initial_state, read_slots,
        write_slots, boundary_slots) as int32, boundary_slots a NULL [R, 1] when None."""
        boundary = self.boundary_slots
        if boundary is None:
            boundary = jnp.zeros((self.num_rows, 1), jnp.int32)
        arrays = (
            self.query_start_loc,
            self.num_computed,
            self.has_initial_state,
            self.read_slots,
            self.write_slots,
            boundary,
        )
        return tuple(jnp.asarray(a).astype(jnp.int32) for a in arrays)

    def check(self, chunk_size: int | None = None) -> int:
        """Raise ValueError naming the field whose shape breaks the contract, or a block size
        that is not a positive multiple of `chunk_size` (when given); return R."""
        check_shape("query_start_loc", self.query_start_loc, (None,))
        num_rows = self.num_rows
        for name in ("num_computed", "has_initial_state", "read_slots", "write_slots"):
            check_shape(name, getattr(self, name), (num_rows,))
        if (self.block_size is None) != (self.boundary_slots is None):
            raise ValueError("block_size and boundary_slots must be given together")
        if self.block_size is not None:
            if self.block_size <= 0 or self.block_size % (chunk_size or 1):
                want = "positive" if chunk_size is None else f"a positive multiple of {chunk_size=}"
                raise ValueError(f"block_size={self.block_size} must be {want}")
            check_shape("boundary_slots", self.boundary_slots, (num_rows, None))
        return num_rows
