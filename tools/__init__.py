"""Developer tooling that is not part of the installed package (benchmarks, device checks,
cross-compilation, upstream-kernel extraction): run from a checkout, `python -m tools....`."""
