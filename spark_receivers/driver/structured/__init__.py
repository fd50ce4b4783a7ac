"""The driver side of the Structured Streaming source: block logs, the offset endpoint."""
