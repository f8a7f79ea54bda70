"""dstl client library: what jobs import to log state changes to the sidecar."""

from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.core.errors import DstlError
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_client.core.version import package_version

__version__ = package_version()

__all__ = [
    "ChangelogClient",
    "ChangelogHandle",
    "ChangelogWriter",
    "DstlError",
    "HandleEntry",
    "__version__",
]
