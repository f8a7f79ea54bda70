"""``python -m dstl_client.ops.cli``: the ``dstl`` command."""

import sys

from dstl_client.ops.cli.main import main

sys.exit(main())
