"""``python -m loadtest.api_bench``: see :mod:`loadtest.api_bench.cli`."""

from loadtest.api_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
