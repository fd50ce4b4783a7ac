"""The exceptions of spark-receivers: one root, a few per subsystem.

Every message says what failed, the value involved and what to do about it.
"""

from __future__ import annotations


class SparkReceiversError(Exception):
    """Root of every error raised by spark-receivers."""


class ConfigError(SparkReceiversError, ValueError):
    """A configuration key has a value that is not allowed."""


class StateError(SparkReceiversError, RuntimeError):
    """An operation was called in a lifecycle state that does not allow it."""


class ReceiverError(SparkReceiversError):
    """A receiver failed, or a record did not fit its schema."""


class BlockStoreError(SparkReceiversError):
    """A block could not be stored, found or read."""


class BlockNotFoundError(BlockStoreError):
    """A block is in neither its block store nor a write-ahead log."""


class RpcError(SparkReceiversError):
    """A remote call failed, was refused or could not be decoded."""


class AuthenticationError(RpcError):
    """A remote peer did not present valid credentials."""


class WriteAheadLogError(SparkReceiversError):
    """A write-ahead log could not be written, read or cleaned."""


class CorruptRecordError(WriteAheadLogError):
    """A write-ahead log record failed its checksum or framing check."""


class CheckpointError(SparkReceiversError):
    """A checkpoint could not be written or read back."""


class OffsetError(SparkReceiversError, ValueError):
    """A Structured Streaming offset is outside what a stream's block log holds."""


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
