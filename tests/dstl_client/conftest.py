"""Client unit tests: keep Hypothesis' caches out of the checkout.

Hypothesis writes ``.hypothesis/`` into the working directory (example
database, constants and unicode caches), the constants already while pytest
collects, so the home directory is moved to a temp dir when this conftest is
imported and removed when the session ends.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="dstl-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HYPOTHESIS_HOME, ignore_errors=True)
