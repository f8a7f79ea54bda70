"""Where an engine's CPU goes: its whole process tree, its JVM, and the JVM's JIT compilers.

The engines' batches are short (seconds), and a fresh JVM keeps compiling
Spark's code (and the classes Spark generates) to machine code for dozens of
batches: on 2 cores the JIT compiler threads took 2.2 CPU s in the second batch of
the vectorized engine and still 0.65 s in its twentieth. So a CPU figure per
batch says little unless it says how much of it is the JVM warming up. This module
samples, for the engine's process tree: everything (user + system, reaped children
included), the JVM process, and the JVM's JIT compiler threads (the threads
Linux names ``C1 CompilerThre`` / ``C2 CompilerThre``; read from
``/proc/<pid>/task``, so NaN on another OS). Any thread may sample.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

NAN = float("nan")
#: the thread-name prefix of HotSpot's JIT compiler threads (Linux truncates names to 15)
JIT_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """Cumulative CPU seconds at one moment. Frozen."""

    #: the engine's process and every descendant alive now (with the children they reaped)
    total_s: float
    #: the JVM process (NaN: none found)
    jvm_s: float = NAN
    #: the JVM's JIT compiler threads (NaN: no JVM, or no ``/proc``)
    jit_s: float = NAN


def jit_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds of the JIT compiler threads of process ``pid`` alive now (NaN: no
    ``/proc`` for it)."""
    tasks = proc / str(pid) / "task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return NAN
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for tid in tids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (tasks / tid / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            if name.startswith(JIT_THREAD_PREFIXES):
                fields = stat[stat.rindex(")") + 2 :].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def sample_tree() -> CpuSample:
    """The CPU of this process's tree now (Spark's JVM is not this process's child to
    wait for, so ``getrusage`` would miss it; the sidecar and Python workers are below)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    jvm = NAN
    jit = NAN
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            c = p.cpu_times()
            own = c.user + c.system
            total += own + c.children_user + c.children_system
            if p.name() == "java" or p.exe().endswith("/java"):
                jvm = own if jvm != jvm else jvm + own
                jit = jit_cpu_s(p.pid)
    return CpuSample(total, jvm, jit)
