"""The exceptions of spark-receivers: one root, a few per subsystem.

Every message says what failed, the value involved and what to do about it.
"""

from __future__ import annotations


class SparkReceiversError(Exception):
    """Root of every error raised by spark-receivers (``except SparkReceiversError``)."""


class ConfigError(SparkReceiversError, ValueError):
    """A value that is not allowed, refused where it is given, on the driver.

    A ``StreamingConfig`` field or ``spark.streaming.*``/``spark.receivers.*`` key, a
    receiver's argument or schema, a union of streams whose fields differ. The
    message names the field (and its Spark key), the value and what is allowed.
    """


class StateError(SparkReceiversError, RuntimeError):
    """An operation was called in a lifecycle state that does not allow it.

    E.g. ``receiver_stream()`` on a started context, ``start()`` twice,
    ``store()`` on a receiver that is not running; the message names the state.
    """


class ReceiverError(SparkReceiversError):
    """A receiver failed, or a record did not fit its schema.

    Raised by ``store()`` (a record that does not fit, naming the field; a
    reliable store the driver refused) and by a receiver's task when it stops
    with an error (seen on the driver in ``status()`` and ``on_receiver_error``).
    """


class BadRecordError(ReceiverError):
    """A receiver met a record it cannot take under ``bad_record_policy='fail'``.

    The receiver stops with it for good: the driver does not restart it (it would
    meet the same record again), processes what was received before it, and fails
    the streaming context with an error naming the stream and why the record is bad.
    """


class BlockStoreError(SparkReceiversError):
    """A block could not be stored, found or read (in the receiver's task or a read task)."""


class BlockNotFoundError(BlockStoreError):
    """A block is in neither its block store nor a write-ahead log.

    A batch that needs it fails, and the context with it, naming the block
    (listeners get ``on_block_lost`` first).
    """


class RpcError(SparkReceiversError):
    """A remote call between the driver and a receiver failed, was refused or was malformed."""


class AuthenticationError(RpcError):
    """A remote peer did not present valid credentials (the application secret's HMAC)."""


class WriteAheadLogError(SparkReceiversError):
    """A write-ahead log (driver or receiver) could not be written, read or cleaned."""


class CorruptRecordError(WriteAheadLogError):
    """A write-ahead log record failed its checksum or framing check (not a torn tail)."""


class CheckpointError(SparkReceiversError):
    """A checkpoint could not be written or read back.

    ``StreamingContext.get_or_create`` raises it for a corrupt checkpoint;
    ``create_on_error=True`` moves it aside and starts afresh instead.
    """


class OffsetError(SparkReceiversError, ValueError):
    """A Structured Streaming offset is outside what a stream's block log holds.

    E.g. a query restarted with a Spark checkpoint whose offsets this context's
    ``checkpoint_dir`` does not hold (the message gives the range it holds), or a
    stream read through offsets that was not made by ``structured_stream``; the
    query fails with it.
    """


class StreamingError(SparkReceiversError):
    """The streaming context failed; raised by ``StreamingContext.await_termination``.

    Its cause (``__cause__``) is the first error that failed the context: a batch's
    output operation, the job generator's timer, a receiver's launcher.
    """


class MissingDependencyError(SparkReceiversError, ImportError):
    """A receiver needs a library that is not installed where it runs.

    Raised on the executor when the receiver starts; the message names the
    package and the extra that installs it (``pip install 'spark-receivers[mqtt]'``).
    """
