"""``python -m loadtest.wire_fuzz``: see :mod:`loadtest.wire_fuzz.cli`."""

import sys

from loadtest.wire_fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
