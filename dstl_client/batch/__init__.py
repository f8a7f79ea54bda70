"""Spark plumbing every API shares: options, inputs, query, the batch cycle, the local runner."""
