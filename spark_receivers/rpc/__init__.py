"""Messages, transport and authentication shared by the driver and the receivers."""
