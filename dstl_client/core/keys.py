"""Object keys and job ids.

Keys are ``<job_id>/<two hex digits>/<32 hex digits>.dstl``: per job first (so
a job's objects can be listed, cleaned and access-checked by prefix), then a
hash spread so one prefix is not a hot spot on S3. Every upload attempt gets a
new key, so attempts never overwrite each other.
"""

from __future__ import annotations

import re
import uuid

from dstl_client.core.errors import InvalidArgument, PermissionDenied

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
OBJECT_SUFFIX = ".dstl"


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):  # not match: "$" accepts a trailing newline
        raise InvalidArgument(
            f"bad job id {job_id[:140]!r}: 1-128 characters of letters, digits, '.', '_', '-'"
        )
    return job_id


def new_object_key(job_id: str) -> str:
    u = uuid.uuid4().hex
    return f"{job_id}/{u[:2]}/{u}{OBJECT_SUFFIX}"


def job_prefix(job_id: str) -> str:
    return f"{check_job_id(job_id)}/"


def check_key_of_job(job_id: str, key: str) -> None:
    """Refuse keys outside the job's prefix (one job cannot touch another's objects)."""
    parts = key.split("/")
    if (
        len(parts) != 3
        or parts[0] != job_id
        or not re.fullmatch(r"[0-9a-f]{2}", parts[1])
        or not re.fullmatch(r"[0-9a-f]{32}" + re.escape(OBJECT_SUFFIX), parts[2])
    ):
        raise PermissionDenied(f"object key {key[:200]!r} does not belong to job {job_id[:140]!r}")
