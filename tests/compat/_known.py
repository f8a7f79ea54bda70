"""Known differences of dstl from Spark: an ``xfail(strict=True)`` per compat test reference.

A reference is ``"<suite>:<name>"`` (``api:delete``, ``types:ts``,
``event:late``), optionally ``"/<style>"`` for one API style only. The
reason names the issue item; ``test_table`` checks that the compatibility
table marks such rows ``differs`` and names that item, and a strict xfail
turns red as soon as dstl gives Spark's rows.
"""

from __future__ import annotations

from typing import Any

import pytest


def marks(xfail: dict[str, str], ref: str, style: str | None = None) -> Any:
    """The xfail mark of ``ref`` (in ``style``), or no mark."""
    reason = (xfail.get(f"{ref}/{style}") if style else None) or xfail.get(ref)
    return pytest.mark.xfail(strict=True, reason=reason) if reason else ()
