"""The version of dstl, read from the installed distribution's metadata.

``pyproject.toml`` holds the one version number; the package metadata carries it
to ``dstl_client.__version__``, both command lines' ``--version``, the
``dstl_build_info`` metrics and (checked by a test) the Helm chart's ``appVersion``.
"""

from __future__ import annotations

from functools import cache

#: what a bare checkout that was never installed reports
UNKNOWN = "unknown"


@cache
def package_version() -> str:
    """The installed ``dstl`` distribution's version (``unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dstl")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return UNKNOWN
