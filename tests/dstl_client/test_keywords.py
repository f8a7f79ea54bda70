"""One unknown-keyword check for every API that takes the query's options."""

from __future__ import annotations

import pytest

from dstl_client.keywords import check_keywords
from dstl_client.processor import transform_with_state
from dstl_client.spark import KeyedOptions


def test_known_keywords_pass_and_unknown_ones_are_named_with_a_hint() -> None:
    check_keywords("f", ["parallelism", "checkpoint_dir"], KeyedOptions)
    with pytest.raises(TypeError) as e:
        check_keywords("f", ["paralelism", "zzz", "parallelism"], KeyedOptions)
    message = str(e.value)
    assert message.startswith("f() got unexpected keyword arguments ['paralelism', 'zzz']")
    assert "paralelism: did you mean parallelism?" in message
    assert "the options are [" in message and "'checkpoint_dir'" in message
    with pytest.raises(TypeError, match=r"\(lister: gone\)"):
        check_keywords("f", ["lister"], KeyedOptions, hints={"lister": "gone"})


def test_the_apis_share_the_check() -> None:
    with pytest.raises(TypeError, match=r"^process_keyed\(\) got unexpected.*did you mean"):
        KeyedOptions.of(None, {"paralelism": 2, "checkpoint_dir": "/tmp/x"})
    with pytest.raises(TypeError, match=r"^transform_with_state\(\) got unexpected.*did you mean"):
        transform_with_state(None, processor=None, output_schema=None, paralelism=2)
