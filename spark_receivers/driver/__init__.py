"""Driver side: tracker, block tracker, scheduling, batches."""
