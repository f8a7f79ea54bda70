"""Micro-benchmark of the sidecar's section encoder (:func:`encode_log_section`).

``python -m loadtest.encode_bench [--baseline PATH]``: times
:func:`~dstl_client.core.format.encode_log_section` on the shapes a flush
encodes, in one process, and prints microseconds per section (min and median
of ``--rounds`` rounds). With ``--baseline`` (a copy of another version of
``dstl_client/core/format.py``, e.g. ``git show main:dstl_client/core/format.py
> /tmp/format_main.py``) both encoders run alternately in the same rounds, the
printed ratios are baseline / current (of the two minimums, and the median of
each round's ratio), and every shape is first checked to give the same bytes
with both.

Shapes (128-byte changes, as ``make bench-core``'s checkpoint phase):

- ``checkpoint``: one changeset of 85 key groups, one part of 1-2 changes each
  (a 64-writer checkpoint's section);
- ``two-changesets``: two changesets of 85 key groups each, half of them shared;
- ``many-parts``: one changeset, one key group of 1,000 one-change parts;
- ``mixed-parts``: one changeset of 85 key groups, half of them of 2-3 parts
  (a writer that sent a key group's changes in several appends);
- ``object-64``: 64 ``checkpoint`` sections encoded and built into one object
  (:func:`~dstl_client.core.format.build_object`): a flush's whole encoding.

Nothing here is a goal checked by ``make``; it measures one function, for A/B
comparisons on a loaded machine (run each side several times, alternated).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dstl_client.core import format as current

CHANGE_BYTES = 128
KEY_GROUPS = 85
LOG_ID = bytes(range(16))


@dataclass(frozen=True, slots=True)
class Shape:
    """One benchmark input: changesets as (SQN, key group -> list of parts, each a list
    of changes), and how many sections one timed call encodes."""

    name: str
    changesets: list[tuple[int, dict[int, list[list[bytes]]]]]
    sections: int = 1


def _changes(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(CHANGE_BYTES) for _ in range(n)]


def _checkpoint_groups(rng: random.Random, kgs: list[int]) -> dict[int, list[list[bytes]]]:
    return {kg: [_changes(rng, rng.choice((1, 2)))] for kg in kgs}


def shapes(seed: int = 1) -> list[Shape]:
    rng = random.Random(seed)
    # key groups ascending, as a client sends a request's parts (and the sidecar's
    # changeset holds them)
    one = _checkpoint_groups(rng, sorted(rng.sample(range(128), KEY_GROUPS)))
    first = sorted(rng.sample(range(128), KEY_GROUPS))
    second = sorted(first[::2] + rng.sample(sorted(set(range(256)) - set(first)), 42))
    return [
        Shape("checkpoint", [(7, one)]),
        Shape(
            "two-changesets",
            [(7, _checkpoint_groups(rng, first)), (8, _checkpoint_groups(rng, second))],
        ),
        Shape("many-parts", [(7, {5: [_changes(rng, 1) for _ in range(1000)]})]),
        Shape(
            "mixed-parts",
            [
                (
                    7,
                    {
                        kg: [_changes(rng, 1) for _ in range(rng.choice((1, 1, 2, 3)))]
                        for kg in first
                    },
                )
            ],
        ),
        Shape("object-64", [(7, one)], sections=64),
    ]


def _encoder(module: ModuleType, shape: Shape) -> Callable[[], bytes]:
    """A call that encodes ``shape`` with ``module``'s types and functions."""
    changesets = [
        module.Changeset(
            sqn, {kg: [module.pack_changes(p) for p in parts] for kg, parts in g.items()}
        )
        for sqn, g in shape.changesets
    ]
    end = changesets[-1].sqn + 1
    encode = module.encode_log_section
    if shape.sections == 1:

        def one() -> bytes:
            return b"".join(encode(LOG_ID, changesets, end).chunks)

        return one
    build = module.build_object
    # an object's writers each have their own changesets (counted on first use)
    writers = [
        [module.Changeset(cs.sqn, cs.groups) for cs in changesets] for _ in range(shape.sections)
    ]

    def many() -> bytes:
        data: bytes = build(encode(LOG_ID, w, end) for w in writers).data
        return data

    return many


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_format", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _time(call: Callable[[], bytes], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - start) / number


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another format.py to compare with")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds per encoder and shape")
    ap.add_argument("--budget-ms", type=float, default=20.0, help="about this long per round")
    args = ap.parse_args(argv)
    encoders = {"current": current}
    if args.baseline is not None:
        encoders = {"baseline": _load(args.baseline), **encoders}
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} CPUs")
    for shape in shapes():
        calls = {name: _encoder(module, shape) for name, module in encoders.items()}
        outputs = {name: call() for name, call in calls.items()}
        if len(set(outputs.values())) != 1:
            raise SystemExit(f"{shape.name}: the encoders give different bytes")
        per_call = _time(calls["current"], 3)
        number = max(1, int(args.budget_ms / 1e3 / max(per_call, 1e-9)))
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):  # alternated: both sides see the same load
            for name, call in calls.items():
                times[name].append(_time(call, number))
        per_section = {n: [t / shape.sections * 1e6 for t in ts] for n, ts in times.items()}
        line = [f"{shape.name:15s}"]
        for name, ts in per_section.items():
            line.append(f"{name} min {min(ts):8.1f} median {statistics.median(ts):8.1f} us")
        if "baseline" in per_section:
            base, cur = per_section["baseline"], per_section["current"]
            # each round's two timings are adjacent: their ratio drifts less with the load
            paired = statistics.median(b / c for b, c in zip(base, cur, strict=True))
            line.append(f"baseline/current: of mins {min(base) / min(cur):4.2f}x")
            line.append(f"per round (median) {paired:4.2f}x")
        print(" | ".join(line) + " (per section)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
