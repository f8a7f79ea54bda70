"""Operator (non-keyed) list state: one list per subtask, redistributed on rescale.

Keyed state follows its key group; some state belongs to a subtask instead
(offsets of a source split, a buffer of the subtask's pending work). As in
Flink, such state is a named **list** per subtask, and the list's elements
are the unit of redistribution when the parallelism changes:

* ``"split"`` (even split): the lists of all old subtasks, concatenated in
  subtask order, are cut into ``p`` contiguous pieces of equal size (the
  first ``n % p`` new subtasks get one element more);
* ``"union"``: every new subtask gets every element.

With the parallelism unchanged every subtask gets its own list back (also
after a failure or a restart).

**Checkpointed through the DSTL.** At the end of a batch in which its
operator state changed (or right after a rescale, which always rewrites
it), a subtask writes the whole snapshot of its lists through a fresh DSTL
writer (``<operator>.opstate``) and persists it, like a materialization part;
the handle travels in its :class:`~dstl_client.checkpoint.messages.TaskResult`
and the checkpoint record keeps one handle per subtask
(:attr:`~dstl_client.checkpoint.records.CheckpointRecord.operator_state`),
carried over from record to record while the list is unchanged. Tasks load
it lazily on first access, from the last recorded checkpoint: a job that
uses no operator state pays nothing.

Snapshot format (``DOS1``): a 4-byte magic, the number of lists, then per
list its name (u16 length + UTF-8), its mode (u8: 0 split, 1 union), its
element count (u32) and the elements (u32 length + bytes each); integers
little-endian. It is cut into changes of at most the writer's change size,
appended in order to the writer's first key group (the object format
checksums every section).

Threads: one :class:`OperatorStates` per subtask attempt, used by the task's
thread only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from dstl_client.core.errors import InvalidArgument
from dstl_client.state.serializers import Serializer

if TYPE_CHECKING:
    from dstl_client.checkpoint.messages import BatchPlan
    from dstl_client.client import ChangelogClient
    from dstl_client.core.handle import ChangelogHandle
    from dstl_client.keygroups import KeyGroupRange

V = TypeVar("V")

#: redistribution modes, by name and by their byte in the snapshot
MODES = ("split", "union")
_MAGIC = b"DOS1"
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

#: one list's mode and elements (encoded by the list's serializer)
Lists = dict[str, tuple[str, list[bytes]]]


def encode_snapshot(lists: Lists) -> bytes:
    """The snapshot bytes of ``lists`` (names sorted: equal lists, equal bytes)."""
    out = [_MAGIC, _U32.pack(len(lists))]
    for name in sorted(lists):
        mode, elements = lists[name]
        raw = name.encode("utf-8")
        out += [_U16.pack(len(raw)), raw, _U8.pack(MODES.index(mode)), _U32.pack(len(elements))]
        for e in elements:
            out += [_U32.pack(len(e)), e]
    return b"".join(out)


def decode_snapshot(data: bytes) -> Lists:
    """Inverse of :func:`encode_snapshot`; :class:`InvalidArgument` for bytes it did not write.

    Every length is checked against the bytes that are there before anything
    is allocated for it.
    """
    view = memoryview(data)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n > len(view) - pos:
            raise InvalidArgument(
                f"operator state snapshot truncated: {n} bytes wanted at {pos} of {len(view)}"
            )
        piece = view[pos : pos + n]
        pos += n
        return piece

    if bytes(take(4)) != _MAGIC:
        raise InvalidArgument("not an operator state snapshot (bad magic)")
    lists: Lists = {}
    for _ in range(_U32.unpack(take(4))[0]):
        name = bytes(take(_U16.unpack(take(2))[0])).decode("utf-8", errors="strict")
        mode_byte = _U8.unpack(take(1))[0]
        if mode_byte >= len(MODES):
            raise InvalidArgument(f"operator state {name!r}: unknown mode {mode_byte}")
        count = _U32.unpack(take(4))[0]
        if count * 4 > len(view) - pos:
            raise InvalidArgument(f"operator state {name!r}: {count} elements cannot fit")
        elements = [bytes(take(_U32.unpack(take(4))[0])) for _ in range(count)]
        lists[name] = (MODES[mode_byte], elements)
    if pos != len(view):
        raise InvalidArgument(f"operator state snapshot has {len(view) - pos} trailing bytes")
    return lists


def redistribute(old: Sequence[Lists], index: int, parallelism: int) -> Lists:
    """What new subtask ``index`` of ``parallelism`` gets from the old subtasks' ``old`` lists."""
    modes: dict[str, str] = {}
    joined: dict[str, list[bytes]] = {}
    for lists in old:
        for name, (mode, elements) in lists.items():
            if modes.setdefault(name, mode) != mode:
                raise InvalidArgument(
                    f"operator state {name!r} was written as both {modes[name]!r} and {mode!r}"
                )
            joined.setdefault(name, []).extend(elements)
    out: Lists = {}
    for name, elements in joined.items():
        if modes[name] == "union":
            out[name] = ("union", list(elements))
        else:
            n = len(elements)
            start = index * n // parallelism
            end = (index + 1) * n // parallelism
            out[name] = ("split", elements[start:end])
    return out


class OperatorListState(Generic[V]):
    """One subtask's list called ``name``: read and replace it within a batch.

    Changes are kept in memory and written at the end of the batch (a failed
    attempt leaves the recorded list as it was). Thread: the task's.
    """

    def __init__(self, owner: OperatorStates, name: str, serializer: Serializer[V]) -> None:
        self._owner = owner
        self._name = name
        self._serializer = serializer

    def get(self) -> list[V]:
        """The elements, in order."""
        return [self._serializer.loads(e) for e in self._owner.elements(self._name)]

    def add(self, value: V) -> None:
        self._owner.set(self._name, [*self._owner.elements(self._name), self._dump(value)])

    def add_all(self, values: Iterable[V]) -> None:
        more = [self._dump(v) for v in values]
        self._owner.set(self._name, [*self._owner.elements(self._name), *more])

    def update(self, values: Iterable[V]) -> None:
        """Replace the elements."""
        self._owner.set(self._name, [self._dump(v) for v in values])

    def clear(self) -> None:
        self._owner.set(self._name, [])

    def _dump(self, value: V) -> bytes:
        return self._serializer.dumps(value)


class OperatorStates:
    """The operator lists of one subtask attempt: loaded on first use, written once at the end.

    Invariants: :meth:`load` runs at most once (lazily, or from
    :meth:`write_if_needed` after a rescale); :meth:`write_if_needed` writes a
    snapshot only if a list changed or the parallelism changed since the
    last record, and returns its handle (``None``: the recorded one stays).
    Thread: the task's.
    """

    def __init__(
        self, plan: BatchPlan, index: int, kg_range: KeyGroupRange, client: ChangelogClient
    ) -> None:
        self.plan = plan
        self.index = index
        self.kg_range = kg_range
        self.client = client
        self._lists: Lists | None = None
        self._modes: dict[str, str] = {}
        self._dirty = False
        #: bytes read at load and written at the end (for the task's figures)
        self.read_bytes = 0
        self.written_bytes = 0

    @property
    def rescaled(self) -> bool:
        committed = self.plan.committed
        return (
            committed is not None
            and bool(committed.operator_state)
            and committed.parallelism != self.plan.parallelism
        )

    def list_state(self, name: str, serializer: Serializer[V], mode: str) -> OperatorListState[V]:
        """The list called ``name``; ``mode`` (``"split"``/``"union"``) says how it is rescaled."""
        if mode not in MODES:
            raise InvalidArgument(f"operator state mode must be one of {MODES}, not {mode!r}")
        if not name:
            raise InvalidArgument("an operator state needs a name")
        lists = self._load()
        known = self._modes.get(name) or (lists[name][0] if name in lists else None)
        if known is not None and known != mode:
            raise InvalidArgument(f"operator state {name!r} is a {known!r} list, not {mode!r}")
        self._modes[name] = mode
        return OperatorListState(self, name, serializer)

    def elements(self, name: str) -> list[bytes]:
        found = self._load().get(name)
        return [] if found is None else found[1]

    def set(self, name: str, elements: list[bytes]) -> None:
        self._load()[name] = (self._modes[name], elements)
        self._dirty = True

    def _load(self) -> Lists:
        if self._lists is None:
            self._lists = self._read()
        return self._lists

    def _read(self) -> Lists:
        committed = self.plan.committed
        if committed is None or not committed.operator_state:
            return {}
        parts = dict(committed.operator_state)
        if committed.parallelism == self.plan.parallelism:
            own = parts.get(self.index)
            return {} if own is None else self._read_part(own)
        old = [self._read_part(parts[i]) for i in sorted(parts)]
        return redistribute(old, self.index, self.plan.parallelism)

    def _read_part(self, handle: ChangelogHandle) -> Lists:
        data = b"".join(d for _kg, _sqn, d in self.client.read_changes(handle))
        self.read_bytes += len(data)
        return decode_snapshot(data)

    def write_if_needed(self) -> ChangelogHandle | None:
        """Write the snapshot if it changed (or the job was rescaled); its handle, else ``None``."""
        if not self._dirty and not self.rescaled:
            return None
        data = encode_snapshot(self._load())
        plan = self.plan
        writer = self.client.create_writer(
            job_id=plan.job_id,
            operator_id=f"{plan.operator_id}.opstate",
            key_group_range=self.kg_range.as_tuple(),
        )
        try:
            step = max(1, writer.max_change_bytes)
            kg = self.kg_range.first
            writer.append_many((kg, data[i : i + step]) for i in range(0, len(data), step))
            handle = writer.persist_durably(after=0).result(timeout=plan.persist_timeout_s)
        finally:
            writer.close()
        self.written_bytes += len(data)
        return handle
