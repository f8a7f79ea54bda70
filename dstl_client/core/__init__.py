"""The wire core: what the sidecar and every client share, and nothing else.

``errors`` (the exception hierarchy and its gRPC codes), ``format`` (the object
and log-section encoding), ``handle`` (handles and their codec), ``reader``
(a handle back to changes), ``keys`` (object keys and job ids), ``durations``
(the one duration parser), ``s3_errors`` (which S3 answers are transient) and ``_pb``
(the generated protobuf and gRPC code). It imports no other module of the
project (an import-linter contract, run by ``make test``).
"""
