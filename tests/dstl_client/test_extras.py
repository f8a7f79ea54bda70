"""A missing ``spark`` extra is an error that says what to install, at every entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dstl_client.extras import SPARK_INSTALL, require_spark

#: each public entry point of the Spark integration, called as a user would
ENTRY_POINTS = {
    "read_state": "from dstl_client.spark import read_state; read_state(None, checkpoint_dir='x')",
    "transform_with_state": (
        "from dstl_client.processor import transform_with_state\n"
        "transform_with_state(None, processor=None, output_schema='a int')"
    ),
    "process_keyed": (
        "from dstl_client.spark import process_keyed\n"
        "process_keyed(None, key='k', fn=None, output_schema='a int')"
    ),
    "process_chain": (
        "from dstl_client.spark import process_chain\nprocess_chain(None, stages=[])"
    ),
    "process_bounded": (
        "from dstl_client.bounded import process_bounded\n"
        "process_bounded(None, key='k', fn=None, output_schema='a int')"
    ),
}


def test_nothing_raised_when_installed() -> None:
    require_spark("this test")  # the dev set installs the extra


def test_missing_module_named_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ModuleNotFoundError) as info:
        require_spark("read_state")
    assert info.value.name == "pyarrow"
    assert "read_state needs pyarrow" in str(info.value) and SPARK_INSTALL in str(info.value)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_say_what_to_install(name: str) -> None:
    # a fresh interpreter in which pyspark cannot be imported
    code = "import sys; sys.modules['pyspark'] = None\n" + ENTRY_POINTS[name]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ") and SPARK_INSTALL in last, proc.stderr
