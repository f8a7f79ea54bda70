"""What the driver and its tasks tell each other and keep: the checkpoint's data.

Below both sides of a keyed operator: :mod:`dstl_client.state` (the task side)
and :mod:`dstl_client.coordinator` (the driver side) import this package, and
never each other.

Module map (one concept each): :mod:`.messages` (the plan a driver sends its
tasks, the result a task sends back), :mod:`.records` (a completed
checkpoint's record and its JSON), :mod:`.next_record` (the record a batch's
results make of the previous one), :mod:`.stats` (a checkpoint's figures),
:mod:`.codec` (the JSON helpers they share and :class:`~.codec.CorruptMetadata`).
"""
