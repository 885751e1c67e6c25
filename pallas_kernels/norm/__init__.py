"""Row statistics of the norms with a fixed reduction order: the sum of squares of each row,
rounded the same whatever other rows share the call (the batch-invariant norms of
`jmamba.layers.norms`).

`reference.py` holds the plain-jnp reference and the input checks; `sum_squares.py` is the op
`row_sum_squares`: one program per block of rows, a row's slices reduced in order.
"""
