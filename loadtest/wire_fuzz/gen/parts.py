"""Key-group parts (``KeyGroupChanges``) for ``Append`` and ``PersistDurably``.

Valid, empty, zero-count, inconsistent, out-of-range, mixed, at the change
limit, near and over the request limit, and very many of them (up to about a
million blank parts of 2 bytes each: what decoding would turn into a million
objects).
"""

from __future__ import annotations

from collections.abc import Sequence

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.encoding import Part, sizes
from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.settings import U32, KiB


class PartsGen(GenBase):
    """Key-group parts (one worker thread, like every generator)."""

    def _valid_part(
        self, kg: int, max_changes: int = 16, max_size: int = 256
    ) -> pb.KeyGroupChanges:
        n = self.rng.randint(1, max_changes)
        lens = [self.rng.randint(0, max_size) for _ in range(n)]
        return pb.KeyGroupChanges(
            key_group=kg, count=n, sizes=sizes(*lens), payload=self.rng.randbytes(sum(lens))
        )

    def _kg_in(self, kg: tuple[int, int]) -> int:
        first, last = kg
        return self.rng.choice((first, last, self.rng.randint(first, last)))

    def _kg_out(self, kg: tuple[int, int]) -> int:
        first, last = kg
        options = [last + 1, U32, 1 << 24, 1 << 31, self.rng.getrandbits(32)]
        if first > 0:
            options.append(first - 1)
        return self.rng.choice([o for o in options if o <= U32 and not first <= o <= last])

    def _inconsistent(self, kg: int) -> pb.KeyGroupChanges:
        mode = self.rng.randrange(9)
        if mode == 0:  # count far above what sizes holds
            return pb.KeyGroupChanges(key_group=kg, count=U32, sizes=sizes(1), payload=b"x")
        if mode == 1:  # sizes not a multiple of 4
            return pb.KeyGroupChanges(key_group=kg, count=1, sizes=b"\x01\x00\x00", payload=b"x")
        if mode == 2:  # sizes add up to more than the payload
            return pb.KeyGroupChanges(key_group=kg, count=2, sizes=sizes(5, 5), payload=b"x" * 9)
        if mode == 3:  # payload longer than the sizes say
            return pb.KeyGroupChanges(key_group=kg, count=1, sizes=sizes(1), payload=b"xy")
        if mode == 4:  # payload without changes
            return pb.KeyGroupChanges(key_group=kg, count=0, sizes=b"", payload=b"orphan")
        if mode == 5:  # huge sizes
            return pb.KeyGroupChanges(
                key_group=kg, count=2, sizes=sizes(U32, U32), payload=b"x" * 16
            )
        if mode == 6:  # a count of 2^30 without sizes
            return pb.KeyGroupChanges(key_group=kg, count=1 << 30, sizes=b"", payload=b"")
        if mode == 7:  # sizes for 3 changes, count says 2
            return pb.KeyGroupChanges(key_group=kg, count=2, sizes=sizes(1, 1, 1), payload=b"xyz")
        return pb.KeyGroupChanges(  # random everything
            key_group=kg,
            count=self.u32(),
            sizes=self.rng.randbytes(self.rng.randrange(0, 64)),
            payload=self.rng.randbytes(self.rng.randrange(0, 64)),
        )

    def _fill(self, msgs: Sequence[pb.KeyGroupChanges], target: int) -> list[Part]:
        """Each of ``msgs`` repeated, together about ``target`` encoded bytes."""
        per_round = sum(len(m.SerializeToString()) + 4 for m in msgs)
        times = max(1, target // max(per_round, 1))
        return [Part(m, times) for m in msgs]

    def _near_or_over_limit(self, kg: tuple[int, int], over: bool) -> list[Part]:
        """Parts of full-size changes that add up to just under (or over) the request limit."""
        s, rng = self.s, self.rng
        if over:
            target = s.max_request_bytes + rng.randint(1, 64 * KiB)
        else:
            target = s.max_request_bytes - rng.randint(8 * KiB, 64 * KiB)
        out: list[Part] = []
        left = target
        while left > 64:
            size = min(left - 32, s.max_change_bytes, rng.choice((s.max_change_bytes, 64 * KiB)))
            payload = rng.randbytes(min(size, 4096)) * (size // 4096) + rng.randbytes(size % 4096)
            out.append(
                Part(
                    pb.KeyGroupChanges(
                        key_group=self._kg_in(kg), count=1, sizes=sizes(size), payload=payload
                    )
                )
            )
            left -= size + 32
        return out

    def parts(
        self,
        kg: tuple[int, int],
        *,
        allow_big: bool = True,
        only: Sequence[tuple[str, int]] = (),
    ) -> tuple[list[Part], str]:
        """Key-group parts for an Append or a Persist, and the name of the mode."""
        s = self.s
        modes: list[tuple[str, int]] = [
            ("valid", 34),
            ("empty", 4),
            ("zero_count", 6),
            ("inconsistent", 14),
            ("bad_kg", 8),
            ("mixed", 6),
            ("change_limit", 4),
        ]
        if allow_big:
            modes += [
                ("near_limit", 4),
                ("over_limit", 1),
                ("many_empty", 4),
                ("blank_parts", 2),
                ("many_small", 4),
                ("many_count", 2),
                ("many_groups", 3),
            ]
        mode = self.weighted(only or modes)
        rng = self.rng
        if mode == "valid":
            return [Part(self._valid_part(self._kg_in(kg))) for _ in range(rng.randint(1, 4))], mode
        if mode == "empty":
            return [], mode
        if mode == "zero_count":
            n = rng.choice((1, 2, 10, 1000))
            return [Part(pb.KeyGroupChanges(key_group=self._kg_in(kg), count=0), n)], mode
        if mode == "inconsistent":
            return [Part(self._inconsistent(self._kg_in(kg)))], mode
        if mode == "bad_kg":
            return [Part(self._valid_part(self._kg_out(kg), 2, 8))], mode
        if mode == "mixed":  # good parts around a bad one: all or nothing
            bad = rng.choice(
                (
                    self._inconsistent(self._kg_in(kg)),
                    self._valid_part(self._kg_out(kg), 1, 4),
                    pb.KeyGroupChanges(key_group=self._kg_in(kg), count=0),
                )
            )
            return [
                Part(self._valid_part(self._kg_in(kg))),
                Part(bad),
                Part(self._valid_part(self._kg_in(kg))),
            ], mode
        if mode == "change_limit":
            size = s.max_change_bytes + rng.choice((0, 0, 1, 1000))
            return [
                Part(
                    pb.KeyGroupChanges(
                        key_group=self._kg_in(kg),
                        count=2,
                        sizes=sizes(1, size),
                        payload=b"y" + b"\xcd" * size,
                    )
                )
            ], mode
        if mode in ("near_limit", "over_limit"):
            return self._near_or_over_limit(kg, over=mode == "over_limit"), mode
        target = int(s.max_request_bytes * rng.uniform(0.3, 0.95))
        kgs = [self._kg_in(kg) for _ in range(rng.randint(1, 4))]
        if mode == "many_empty":
            return self._fill([pb.KeyGroupChanges(key_group=k) for k in kgs], target), mode
        if mode == "blank_parts":  # the probe's shape: 2 bytes on the wire per part
            return [Part(pb.KeyGroupChanges(), target // 2)], mode
        if mode == "many_small":
            msgs = [
                pb.KeyGroupChanges(key_group=k, count=1, sizes=sizes(len(p)), payload=p)
                for k, p in zip(kgs, (b"", b"x", b"", b"yz"), strict=False)
            ]
            return self._fill(msgs, target), mode
        if mode == "many_count":  # one part of very many zero-length changes (valid)
            n = target // 4
            return [Part(pb.KeyGroupChanges(key_group=kgs[0], count=n, sizes=bytes(4 * n)))], mode
        # many_groups: many small valid parts, every key group different where possible
        first, last = kg
        n = rng.choice((100, 1000, 10_000))
        return [
            Part(
                pb.KeyGroupChanges(
                    key_group=first + i % (last - first + 1), count=1, sizes=sizes(1), payload=b"g"
                )
            )
            for i in range(n)
        ], mode
