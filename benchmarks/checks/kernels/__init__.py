"""The parts of the kernel grid that `benchmarks/checks/kernel_grid.py` runs: what a grid point is
and how it is judged (`case`), the row layouts and random inputs the points draw (`layouts`), how
they are compiled and run under time limits (`runner`), and one module of grid points per op
family (`conv`, `ssd`, `gdn`, `attention`, `moe`; `fused_decode` is the case both fused decode ops
share)."""
