"""``python -m loadtest.bounded_bench``: see :mod:`loadtest.bounded_bench.cli`."""

from loadtest.bounded_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
