"""Where one attempt of a subtask is, and the guard that keeps its steps in order.

An attempt (:class:`~dstl_client.state.subtask.Subtask`) goes
``NEW -> OPEN -> PERSISTED -> COMMITTED``: :meth:`~.Subtask.open` prepares
the store and the writer (``OPEN``), :meth:`~.Subtask.finish` makes the
batch's changes durable at the sidecar (``PERSISTED``) and then commits the
batch locally (``COMMITTED``). A step that raises, or an attempt closed with
an error, ends in ``FAILED``, from which no step runs again (the engine runs
a new attempt). A step called in another status raises
:class:`SubtaskStatusError` and changes nothing. Thread: the task's only.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["SubtaskStatus", "SubtaskStatusError", "SubtaskSteps", "step"]

P = ParamSpec("P")
R = TypeVar("R")


class SubtaskStatus(enum.Enum):
    """The status of one attempt of a subtask (see the module)."""

    NEW = "new"
    OPEN = "open"
    PERSISTED = "persisted"
    COMMITTED = "committed"
    FAILED = "failed"


class SubtaskStatusError(RuntimeError):
    """A step of a subtask called in a status that does not allow it (a caller's bug)."""

    def __init__(self, step: str, status: SubtaskStatus, allowed: SubtaskStatus) -> None:
        super().__init__(
            f"subtask step {step!r} needs status {allowed.value!r}, the attempt is {status.value!r}"
        )
        self.step = step
        self.status = status
        self.allowed = allowed


class SubtaskSteps:
    """The status of one attempt; :meth:`step` runs a step from the status it needs.

    Invariant: the status only moves forward along
    ``NEW -> OPEN -> PERSISTED -> COMMITTED``, or to ``FAILED`` (final).
    Thread: the task's only.
    """

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = SubtaskStatus.NEW

    @contextmanager
    def step(self, name: str, needs: SubtaskStatus, then: SubtaskStatus) -> Iterator[None]:
        """Run the body of step ``name`` from status ``needs``; ``then`` once it returned.

        Raises :class:`SubtaskStatusError` (nothing run) in another status; a
        body that raises leaves the attempt ``FAILED``.
        """
        if self.status is not needs:
            raise SubtaskStatusError(name, self.status, needs)
        try:
            yield
        except BaseException:
            self.status = SubtaskStatus.FAILED
            raise
        self.status = then

    def reached(self, status: SubtaskStatus) -> None:
        """A milestone inside a step (``PERSISTED`` inside ``finish``)."""
        self.status = status

    def fail(self) -> None:
        """The attempt failed (closed with an error): no step runs again."""
        self.status = SubtaskStatus.FAILED


class _HasSteps(Protocol):
    @property
    def steps(self) -> SubtaskSteps: ...


S = TypeVar("S", bound=_HasSteps)


def step(
    name: str, needs: SubtaskStatus, then: SubtaskStatus
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """A method that is step ``name`` of its object's :attr:`steps` (see :meth:`SubtaskSteps.step`)."""

    def wrap(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def guarded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with self.steps.step(name, needs, then):
                return method(self, *args, **kwargs)

        return guarded

    return wrap
