"""Fixtures of the deployment tests: the Helm chart, loaded once per module."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python as helm
import pytest

from tests.deploy._helpers import CHART


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    """The chart in deploy/helm/dstl, loaded through the Helm SDK."""
    with helm.Chart.load(CHART) as loaded:
        yield loaded
