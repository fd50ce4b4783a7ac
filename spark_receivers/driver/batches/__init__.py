"""Time into batches.

The job generator, the received block tracker and its WAL events, the stream graph,
the batch reader, the checkpoint.
"""
