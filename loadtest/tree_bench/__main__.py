"""``python -m loadtest.tree_bench``: see :mod:`loadtest.tree_bench.cli`."""

from loadtest.tree_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
