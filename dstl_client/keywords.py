"""The one check of an API's keyword options: every unknown keyword is a TypeError.

``process_keyed``, ``transform_with_state`` and ``process_bounded`` take the
query's options (the fields of ``KeyedOptions``) as keywords; each calls
:func:`check_keywords` before anything else, so a misspelled option fails the
call at once, with the same message everywhere. Pure function, any thread.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["check_keywords"]


def check_keywords(
    caller: str,
    given: Iterable[str],
    options: type[Any],
    *,
    hints: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`TypeError` if a name in ``given`` is no field of the dataclass ``options``.

    The message names the call, every unknown keyword (with ``hints[name]``
    when given, e.g. why an option was removed, else the closest valid name)
    and the valid options.
    """
    valid = sorted(f.name for f in dataclasses.fields(options))
    unknown = sorted(set(given) - set(valid))
    if not unknown:
        return
    notes = []
    for name in unknown:
        if hints and name in hints:
            notes.append(f"{name}: {hints[name]}")
        elif close := difflib.get_close_matches(name, valid, n=1):
            notes.append(f"{name}: did you mean {close[0]}?")
    raise TypeError(
        f"{caller}() got unexpected keyword arguments {unknown}"
        + (f" ({'; '.join(notes)})" if notes else "")
        + f"; the options are {valid}"
    )
