"""``python -m loadtest.s3fault``: see :mod:`loadtest.s3fault.cli`."""

from loadtest.s3fault.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
