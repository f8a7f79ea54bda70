"""Load generator and benchmarks for dstl (make bench)."""
