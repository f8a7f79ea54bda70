"""The driver side of a keyed operator: it plans batches, records checkpoints, keeps state.

What the driver and its tasks exchange and keep (the plan, the task result, the
checkpoint record, its statistics) is one floor below, in
:mod:`dstl_client.checkpoint`; the task side is :mod:`dstl_client.state`. This
package never imports :mod:`dstl_client.state`, nor it this one.

Module map (one role each): :mod:`.metadata` (the job metadata store: a
directory or S3), :mod:`.storage`, :mod:`.registry`, :mod:`.config`,
:mod:`.batches`, :mod:`.retention`, :mod:`.cleanup`, :mod:`.watchdog`,
:mod:`.overrides`, :mod:`.dynamic_config`, :mod:`.last_writers`,
:mod:`.metrics`, :mod:`.coordinator` (sequences them), :mod:`.rest` (with
:mod:`.rest_limits`). The local runner is :mod:`dstl_client.batch.local`.
"""
