"""``python -m loadtest.cluster_bench``: see :mod:`loadtest.cluster_bench.cli`."""

from loadtest.cluster_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
