"""The receivers seen from the driver.

The tracker core and the state of each receiver, placement and restarts, the launcher,
the outbox, the block keepers' registry.
"""
