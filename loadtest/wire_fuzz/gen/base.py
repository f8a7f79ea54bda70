"""Random numbers, ids and call order fields: what every request generator draws from."""

from __future__ import annotations

import random
from collections.abc import Sequence

from loadtest.wire_fuzz.calls import Writer
from loadtest.wire_fuzz.encoding import c64
from loadtest.wire_fuzz.settings import (
    INTERESTING_U32,
    INTERESTING_U64,
    U64,
    FuzzSettings,
    KiB,
    MiB,
)


class GenBase:
    """Random values; every choice comes from ``rng`` (one per worker).

    Not thread-safe: a generator and its ``rng`` belong to one worker thread,
    which is what makes a seed reproduce that worker's choices.
    """

    def __init__(
        self, rng: random.Random, settings: FuzzSettings, ordered_fraction: float = 0.5
    ) -> None:
        self.rng = rng
        self.s = settings
        self.ordered_fraction = ordered_fraction

    # ---------------------------------------------------------- numbers
    def u64(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(INTERESTING_U64)
        if r < 0.8:
            return self.rng.randrange(0, 1000)
        return self.rng.getrandbits(64)

    def u32(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(INTERESTING_U32)
        if r < 0.8:
            return self.rng.randrange(0, 1000)
        return self.rng.getrandbits(32)

    def weighted(self, options: Sequence[tuple[str, int]]) -> str:
        return self.rng.choices([o for o, _ in options], [w for _, w in options])[0]

    # ---------------------------------------------------------- ids and keys
    def hex32(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def foreign_log_id(self) -> str:
        return self.rng.choice(
            (
                lambda: self.hex32(),
                lambda: "",
                lambda: self.hex32().upper(),
                lambda: self.hex32()[:31],
                lambda: self.hex32() + "0",
                lambda: "zz" * 16,
                lambda: "\u00e9" * 32,
                lambda: "\x00" * 32,
                lambda: "../" * 20,
                lambda: "a" * self.rng.choice((1000, 64 * KiB, 1 * MiB)),
            )
        )()

    def object_key(self, job: str) -> str:
        """A well-formed object key of ``job`` (no such object, most likely)."""
        h = self.hex32()
        return f"{job}/{h[:2]}/{h}.dstl"

    # ---------------------------------------------------------- call order
    def order_fields(self, w: Writer) -> tuple[int, int, bool]:
        """(session, seq, ordered) for a call of writer ``w``."""
        if w.ordered:
            return w.session, w.next_seq, True
        rng = self.rng
        session = self.weighted(
            [("same", 70), ("new", 10), ("zero", 5), ("max", 5), ("random", 10)]
        )
        ses = {
            "same": w.session,
            "new": rng.getrandbits(64) or 1,
            "zero": 0,
            "max": U64,
            "random": self.u64(),
        }[session]
        seq_mode = self.weighted(
            [
                ("next", 50),
                ("zero", 10),
                ("skip", 8),
                ("far", 6),
                ("huge", 10),
                ("dup", 6),
                ("random", 10),
            ]
        )
        seq = {
            "next": w.next_seq,
            "zero": 0,
            "skip": c64(w.next_seq + rng.randint(1, 5)),
            "far": c64(w.next_seq + rng.choice((1023, 1024, 1025, 5000, 1 << 20))),
            "huge": rng.choice(((1 << 32), (1 << 63) - 1, 1 << 63, U64 - 1, U64)),
            "dup": max(1, w.next_seq - 1),
            "random": self.u64(),
        }[seq_mode]
        return ses, seq, False
