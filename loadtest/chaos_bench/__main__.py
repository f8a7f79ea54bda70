"""``python -m loadtest.chaos_bench``: see :mod:`loadtest.chaos_bench.cli`."""

from loadtest.chaos_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
