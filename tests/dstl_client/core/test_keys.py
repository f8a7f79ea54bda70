"""Job ids and object keys: validation and the per-job access check."""

from __future__ import annotations

import re

import pytest

from dstl_client.core.errors import InvalidArgument, PermissionDenied
from dstl_client.core.keys import check_job_id, check_key_of_job, job_prefix, new_object_key

GOOD_JOBS = ["j", "job-1", "Job_2.attempt-3", "0abc", "a" * 128, "spark.app-20260101_0001"]
BAD_JOBS = [
    "",
    "a" * 129,
    ".hidden",
    "-dash",
    "_under",
    "has/slash",
    "has space",
    "dots/../up",
    "..",
    "tab\t",
    "newline\n",
    "jöb",
    "job*",
    "job\x00",
]


@pytest.mark.parametrize("job", GOOD_JOBS)
def test_valid_job_ids(job: str) -> None:
    assert check_job_id(job) == job
    assert job_prefix(job) == job + "/"


@pytest.mark.parametrize("job", BAD_JOBS)
def test_invalid_job_ids(job: str) -> None:
    with pytest.raises(InvalidArgument, match="bad job id"):
        check_job_id(job)
    with pytest.raises(InvalidArgument):
        job_prefix(job)


def test_new_object_keys() -> None:
    keys = {new_object_key("job-1") for _ in range(1000)}
    assert len(keys) == 1000  # a new key every time: attempts never overwrite each other
    spreads = set()
    for key in keys:
        assert re.fullmatch(r"job-1/[0-9a-f]{2}/[0-9a-f]{32}\.dstl", key), key
        _, spread, name = key.split("/")
        assert name.startswith(spread)  # the spread is the start of the name
        spreads.add(spread)
        check_key_of_job("job-1", key)
    assert len(spreads) > 100  # spread over many prefixes, not one hot spot


def test_key_of_another_job_is_refused() -> None:
    key = new_object_key("job-a")
    with pytest.raises(PermissionDenied, match="does not belong to job 'job-b'"):
        check_key_of_job("job-b", key)
    # a job whose id is a prefix of another's
    with pytest.raises(PermissionDenied):
        check_key_of_job("job", new_object_key("job-a"))


@pytest.mark.parametrize(
    "key",
    [
        "job",
        "job/",
        "job/ab",
        "job/ab/",
        "job/ab/" + "a" * 32,  # no suffix
        "job/ab/" + "a" * 32 + ".tmp",
        "job/AB/" + "a" * 32 + ".dstl",  # upper case
        "job/ab/" + "A" * 32 + ".dstl",
        "job/abc/" + "a" * 32 + ".dstl",
        "job/ab/" + "a" * 31 + ".dstl",
        "job/ab/" + "a" * 33 + ".dstl",
        "job/ab/cd/" + "a" * 32 + ".dstl",
        "/job/ab/" + "a" * 32 + ".dstl",
        "../job/ab/" + "a" * 32 + ".dstl",
        "job/../other/ab/" + "a" * 32 + ".dstl",
        "job/ab/" + "a" * 32 + ".dstl/x",
        "job/ab/" + "a" * 32 + ".dstl\n",
        "other/ab/" + "a" * 32 + ".dstl",
    ],
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(PermissionDenied):
        check_key_of_job("job", key)
