"""``python -m loadtest.hedging_bench``: see :mod:`loadtest.hedging_bench.cli`."""

from loadtest.hedging_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
