"""What the driver shows of itself.

The listener bus and its events, status snapshots, progress, receiver metrics,
Prometheus, the status page.
"""
