"""The driver's configuration endpoint: a token that is given must be a token.

A blank ``config_token`` (spaces, a newline from a file) used to turn on a
check against a guessable token, also off loopback where a token is required;
now it is refused before anything binds, like an empty node secret.
"""

from __future__ import annotations

import pytest

from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.core.errors import ConfigError


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize("token", [" ", "\n", " \t "])
def test_a_blank_token_is_refused_before_binding(host: str, token: str) -> None:
    with pytest.raises(ConfigError, match="config_token is blank"):
        CheckpointConfigServer(host=host, token=token)


def test_no_token_on_loopback_is_the_explicit_default() -> None:
    server = CheckpointConfigServer()
    server.close()
