"""``python -m loadtest.bench``: see :mod:`loadtest.bench.cli`."""

from loadtest.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
