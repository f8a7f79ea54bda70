"""``python -m loadtest.recovery_bench``: see :mod:`loadtest.recovery_bench.cli`."""

from loadtest.recovery_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
