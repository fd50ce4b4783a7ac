"""PySpark glue: the batch reader over blocks and the receiver job launcher."""
