"""The optional extras of dstl, and a clear error when one is missing.

The Spark integration (``dstl_client.processor``, ``dstl_client.spark``,
``dstl_client.bounded``) needs the ``spark`` extra: PySpark, pyarrow and pandas.
They are imported lazily, so ``dstl_client`` imports without them; each public
entry point calls :func:`require_spark` first, so a missing one is a
``ModuleNotFoundError`` that says what to install rather than a bare import
error from deep inside. Pure function: any thread.
"""

from __future__ import annotations

import importlib.util
import sys

#: the command that installs the Spark integration's dependencies
SPARK_INSTALL = "pip install 'dstl[spark]'"
SPARK_MODULES = ("pyspark", "pyarrow", "pandas")


def require_spark(feature: str) -> None:
    """Raise ``ModuleNotFoundError`` naming ``feature`` and the install command if the
    ``spark`` extra is not installed."""
    missing = [m for m in SPARK_MODULES if not _installed(m)]
    if missing:
        raise ModuleNotFoundError(
            f"{feature} needs {', '.join(missing)}, which are not installed: "
            f"install dstl's Spark extra with {SPARK_INSTALL}",
            name=missing[0],
        )


def _installed(module: str) -> bool:
    if module in sys.modules:  # imported already, or blocked (``None``)
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None
