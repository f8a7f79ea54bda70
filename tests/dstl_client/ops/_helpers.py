"""What the CLI tests share: a real job's checkpoints (LocalRunner, real sidecar), the CLI."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.ops.cli import main
from tests.dstl_client.state._jobs import make_batches, make_coordinator, runner

BATCHES = make_batches(8, rows=120, keys=25)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def dstl(*argv: str) -> Result:
    """The CLI in this process: ``main([...])`` with its output captured."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


@dataclass
class Job:
    """A job run batch by batch through the coordinator, as a driver would."""

    root: Path
    address: str
    job_id: str

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "ckpt"

    def where(self) -> list[str]:
        """The CLI's options naming this job and the sidecar."""
        return ["--checkpoint-dir", str(self.checkpoint_dir), "--address", self.address]

    def coordinator(self, **kw: Any) -> CheckpointCoordinator:
        return make_coordinator(
            self.root, self.address, job_id=self.job_id, retain=kw.pop("retain", 3), **kw
        )

    def run(
        self,
        client: ChangelogClient,
        batches: range,
        *,
        materialize_at: tuple[int, ...] = (2,),
        data: list[list[dict[str, Any]]] | None = None,
        **kw: Any,
    ) -> CheckpointCoordinator:
        """Run ``batches`` (materializing at ``materialize_at``); the stopped coordinator."""
        coord = self.coordinator(**kw)
        try:
            run = runner(coord, 2, client)
            for b in batches:
                coord.set_materialize_interval(0.0 if b in materialize_at else 3600.0)
                run.run_batch(b, (data or BATCHES)[b], source_progress={"batch": b})
        finally:
            coord.close()
        return coord
