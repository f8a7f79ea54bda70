"""The wire fuzzer's request generators, one module per family of RPCs.

:class:`Gen` puts them together; every choice of every generator comes from
the one ``random.Random`` it was made with, so a worker's seed fixes its
choices (the requests also depend on the server's answers).
"""

from __future__ import annotations

from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.gen.forward import ForwardCalls
from loadtest.wire_fuzz.gen.garbage import GarbageCalls
from loadtest.wire_fuzz.gen.jobs import JobCalls
from loadtest.wire_fuzz.gen.parts import PartsGen
from loadtest.wire_fuzz.gen.read import ReadCalls
from loadtest.wire_fuzz.gen.writer import WriterCalls

__all__ = [
    "ForwardCalls",
    "GarbageCalls",
    "Gen",
    "GenBase",
    "JobCalls",
    "PartsGen",
    "ReadCalls",
    "WriterCalls",
]


class Gen(WriterCalls, ReadCalls, JobCalls, ForwardCalls, GarbageCalls):
    """Every request the fuzzer sends. Belongs to one worker thread (not thread-safe)."""
