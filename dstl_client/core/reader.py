"""Turns a handle back into changes: exactly its writer's, in SQN order.

:class:`HandleReader` reads through any byte-range fetch function (the
sidecar's blob store, or a local file for tools), so the same code serves the
``ReadChanges`` RPC and direct reads. It may be used from one asyncio task at a
time per call; it holds no state between calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from dstl_client.core.errors import CorruptObject, InvalidArgument
from dstl_client.core.format import (
    LOG_FIXED_SIZE,
    ChangesetView,
    log_header_length,
    parse_kg_block,
    parse_log_header,
)
from dstl_client.core.handle import ChangelogHandle, HandleEntry

Fetch = Callable[[str, int, int], Awaitable[bytes]]
"""``fetch(object_key, offset, length) -> bytes``: a ranged read."""

#: sections up to this size are read in one request even for one key group
WHOLE_SECTION_READ_BYTES = 1 << 20


class HandleReader:
    """Reads the changes of a handle, filtered by SQN range and key groups."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch

    async def read(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> AsyncIterator[ChangesetView]:
        """Yield changesets of the wanted key groups, in (entry, key group, SQN) order.

        Within one key group the changesets come in SQN order. Raises
        :class:`CorruptObject` on any checksum or structure failure.
        """
        first, last = handle.key_group_range
        if key_groups is None:
            wanted: set[int] | None = None
        else:
            wanted = set(key_groups)
            outside = sorted(kg for kg in wanted if not first <= kg <= last)
            if outside:
                raise InvalidArgument(
                    f"key groups {outside[:5]} are outside the handle's range [{first}, {last}]"
                )
        for entry in handle.entries:
            if entry.end_sqn <= handle.from_sqn or entry.first_sqn >= handle.to_sqn:
                continue
            try:
                async for view in self._read_entry(handle, entry, wanted):
                    if handle.from_sqn <= view.sqn < handle.to_sqn:
                        yield view
            except CorruptObject as exc:
                if entry.object_key in exc.message:
                    raise
                # Name the damaged object: the format parsers only know offsets.
                raise CorruptObject(f"{entry.object_key}@{entry.offset}: {exc.message}") from exc

    async def _read_entry(
        self, handle: ChangelogHandle, entry: HandleEntry, wanted: set[int] | None
    ) -> AsyncIterator[ChangesetView]:
        whole = entry.length <= WHOLE_SECTION_READ_BYTES or wanted is None
        if whole:
            section = await self._get(entry, 0, entry.length)
            index = parse_log_header(section, entry.length)
        else:
            prefix = await self._get(entry, 0, min(entry.length, LOG_FIXED_SIZE))
            hlen = log_header_length(prefix)
            if hlen > entry.length:
                raise CorruptObject(
                    f"{entry.object_key}@{entry.offset}: log header of {hlen} bytes does not "
                    f"fit the {entry.length}-byte section"
                )
            index = parse_log_header(await self._get(entry, 0, hlen), entry.length)
        if index.log_id.hex() != handle.log_id:
            raise CorruptObject(
                f"{entry.object_key}@{entry.offset}: section belongs to log "
                f"{index.log_id.hex()}, the handle names {handle.log_id}"
            )
        if index.first_sqn != entry.first_sqn or index.end_sqn != entry.end_sqn:
            raise CorruptObject(f"{entry.object_key}@{entry.offset}: SQN range differs from handle")
        for kg, (off, length) in index.key_groups.items():
            if wanted is not None and kg not in wanted:
                continue
            if not handle.key_group_range[0] <= kg <= handle.key_group_range[1]:
                raise CorruptObject(
                    f"{entry.object_key}: key group {kg} outside the writer's range"
                )
            block = section[off : off + length] if whole else await self._get(entry, off, length)
            for view in parse_kg_block(kg, block):
                yield view

    async def _get(self, entry: HandleEntry, offset: int, length: int) -> bytes:
        data = await self._fetch(entry.object_key, entry.offset + offset, length)
        if len(data) != length:
            raise CorruptObject(
                f"{entry.object_key}: wanted {length} bytes at {entry.offset + offset}, "
                f"got {len(data)} (truncated object?)"
            )
        return data
