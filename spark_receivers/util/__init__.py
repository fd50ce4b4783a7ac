"""Small utilities shared by the driver and the executors."""
