"""Public alias of :mod:`dstl_client.core.errors` (the exception hierarchy)."""

from dstl_client.core.errors import *  # noqa: F403
from dstl_client.core.errors import __all__ as __all__
