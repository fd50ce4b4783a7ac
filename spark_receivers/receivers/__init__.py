"""Built-in receivers."""
