"""The operator CLI, ``dstl``: checkpoints, state, objects, cleanup and configuration of jobs.

For the people who run jobs (see :mod:`.cli` and README "Operating: the
``dstl`` CLI"). Built on the driver's own parts (records, retention,
cleanup, the state reader, the sidecar client), so it reads and decides
exactly as a running driver would; it adds no format of its own.
"""
