"""The base class of every receiver, the public face of the executor side."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pyarrow as pa

from spark_receivers.errors import BadRecordError, ReceiverError, StateError
from spark_receivers.receiver.bad_records import BadRecordPolicy, DeadLetterWriter
from spark_receivers.receiver.schema import (
    DEFAULT_SCHEMA,
    SchemaLike,
    as_arrow_schema,
)
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.util.extras import Requirement, require

if TYPE_CHECKING:
    from spark_receivers.receiver.intake import Intake
    from spark_receivers.receiver.source_support import JobName

log = logging.getLogger(__name__)


class SupervisorLike(Protocol):
    """What a receiver asks of the supervisor running it (``receiver/supervisor.py``).

    Its lifecycle only: what it stores goes to its pipe's intake, not through the supervisor.

    Test harnesses implement it too, to run a receiver without Spark.
    """

    def restart_receiver(
        self, message: str, error: BaseException | None, delay_ms: int | None
    ) -> None:
        """Stop the receiver, wait, start it again."""
        ...

    def stop(self, message: str, error: BaseException | None = None) -> None:
        """Stop for good."""
        ...

    def report_error(self, message: str, error: BaseException | None) -> None:
        """Tell the driver about an error."""
        ...

    def accepted_position(self) -> str | None:
        """The last source position the driver accepted for this receiver's stream."""
        ...

    def is_receiver_started(self) -> bool:
        """True while the receiver runs."""
        ...

    def is_receiver_stopped(self) -> bool:
        """True once it stopped (or during a restart's delay)."""
        ...


class Receiver:
    """A source of records, run as a long-lived Spark task on an executor.

    Subclass it and implement :meth:`on_start` (must not block: start your
    threads there) and :meth:`on_stop` (release what ``on_start`` took). From
    any thread, :meth:`store` hands records to spark-receivers:

    * ``store("a record")``: one record, buffered into the current block;
    * ``store(["a", "b"])`` (any list or iterable): many records in one call;
    * ``store(batch)`` with a ``pyarrow.RecordBatch``/``Table`` or a pandas frame:
      stored as a block of its own, without per-record work;
    * ``store(..., reliable=True)``: returns only once the block is stored (and
      in the WAL when enabled) and the driver accepted it, and raises otherwise,
      so the receiver may then acknowledge its source.
    * ``store(records, position="...", reliable=True)``: the records as a block of
      their own, with the source position they cover (a string of the receiver's
      own format: a Redis entry id, a file offset). The driver keeps the newest one
      in its WAL; after a restart (of the receiver, its executor, or the driver
      with ``get_or_create``) :meth:`accepted_position` returns it, so the receiver
      can resume after it instead of storing the same records again.

    The records' schema is one string column ``value`` unless the receiver
    declares another, with ``schema=`` or a class attribute ``schema``, as a
    ``pyarrow.Schema``, a PySpark ``StructType`` or a DDL string
    (``"ts timestamp, key string, value double"``). It is converted to Arrow and
    checked once, on the driver, when the receiver (or its class) is made: a
    schema Spark could not read raises :class:`ConfigError` there.

    ``storage_level`` says where its blocks are kept: by default
    ``MEMORY_AND_DISK_2``, as in Spark — in the block keeper of the receiver's
    executor (memory, spilling to disk) and copied to a second executor before the
    driver hears of a block, so losing the receiver's task or its executor loses
    nothing the driver accepted. It takes a :class:`StorageLevel`, its name or
    PySpark's ``StorageLevel`` (``StorageLevel.MEMORY_AND_DISK_2``), mapped by its
    flags; anything else is a :class:`ConfigError`.

    The receiver object is pickled (cloudpickle) to the executor; keep
    connections and threads out of ``__init__``.

    Example::

        class Ticker(Receiver):
            def on_start(self):
                threading.Thread(target=self._run, daemon=True).start()
            def on_stop(self):
                pass
            def _run(self):
                while not self.is_stopped():
                    self.store("tick")
    """

    #: Libraries the receiver imports when it runs, each with the extra installing it
    #: (``spark_receivers.util.extras``): imported before ``on_start`` on the executor,
    #: a missing one stops the receiver with :class:`MissingDependencyError`.
    requires: ClassVar[tuple[Requirement, ...]] = ()

    # Class-level defaults, so that a subclass that forgets super().__init__() works.
    storage_level: StorageLevel = StorageLevel.MEMORY_AND_DISK_2
    preferred_location: str | None = None
    schema: pa.Schema = DEFAULT_SCHEMA
    bad_record_policy: BadRecordPolicy = BadRecordPolicy.SKIP
    dead_letter_dir: str | None = None
    bad_records: int = 0
    report_first: int = 10
    report_every: int = 1000
    _stream_id: int = -1
    _supervisor: SupervisorLike | None = None
    _intake: Intake | None = None
    _add_text: Callable[[str], None] | None = None
    _dead_letters: DeadLetterWriter | None = None

    def __init__(
        self,
        storage_level: StorageLevel | str | Any = StorageLevel.MEMORY_AND_DISK_2,
        *,
        schema: SchemaLike | None = None,
        preferred_location: str | None = None,
        bad_record_policy: str | BadRecordPolicy = "skip",
        dead_letter_dir: str | None = None,
    ) -> None:
        self.storage_level = StorageLevel.of(
            storage_level, f"{type(self).__name__}(storage_level=...)"
        )
        self.preferred_location = preferred_location
        if schema is not None:
            self.schema = as_arrow_schema(schema, f"{type(self).__name__}(schema=...)")
        self.bad_record_policy = BadRecordPolicy.parse(bad_record_policy, dead_letter_dir)
        self.dead_letter_dir = dead_letter_dir

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A schema declared as a class attribute is converted (and checked) once, when
        # the class is made on the driver; the executor only sees the Arrow schema.
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("schema")
        if declared is not None and not hasattr(declared, "__get__"):
            cls.schema = as_arrow_schema(declared, f"{cls.__qualname__}.schema")

    # --- to implement -------------------------------------------------------

    def on_start(self) -> None:
        """Start receiving (on the supervisor's thread; must not block)."""
        raise NotImplementedError

    def on_stop(self) -> None:
        """Stop receiving and release what :meth:`on_start` took."""
        raise NotImplementedError

    def prepare_source(self, job: JobName) -> None:
        """Have the source keep what it gets for this receiver from now on (driver, once).

        Called by ``StreamingContext.start()`` for each receiver before its task is
        launched, with the :class:`~spark_receivers.receiver.source_support.JobName`
        its durable names derive from. A source that keeps state per client (an MQTT
        broker's session) can open that state here, so that what is published between
        the start and the moment the receiver's task connects (seconds, or minutes on
        a busy cluster) waits for it. Best effort and bounded (a few seconds): an
        exception is logged as a warning and the start goes on. Keep nothing on
        ``self`` that cannot be pickled. The default does nothing.
        """

    # --- to call ------------------------------------------------------------

    @property
    def stream_id(self) -> int:
        """The id of the input stream this receiver feeds (set by the context)."""
        return self._stream_id

    def store(
        self,
        data: Any,
        metadata: dict[str, Any] | None = None,
        reliable: bool = False,
        *,
        position: str | None = None,
    ) -> None:
        """Store one record, many records, or an Arrow/pandas block (see the class doc).

        ``position``: the source position these records cover (see the class doc);
        the records then make a block of their own.
        Blocks while the rate limit or a full block queue holds the receiver back.
        """
        add_text = self._add_text
        if (
            type(data) is str
            and metadata is None
            and not reliable
            and position is None
            and add_text is not None
        ):
            add_text(data)  # the hot path: one record, default schema
            return
        if position is not None and type(position) is not str:
            msg = (
                f"store(position=...) must be a str (the receiver's own encoding of "
                f"its source position), got {type(position).__name__}: {position!r:.60}"
            )
            raise ReceiverError(msg)
        intake = self._intake
        if intake is None:
            raise self._not_running()
        intake.admit(data, metadata, reliable, position)

    def restart(
        self, message: str, error: BaseException | None = None, delay_ms: int | None = None
    ) -> None:
        """Restart the receiver: returns at once; stop, wait ``delay_ms``, start run elsewhere."""
        self._attached().restart_receiver(message, error, delay_ms)

    def stop(self, message: str, error: BaseException | None = None) -> None:
        """Stop the receiver for good (the task ends; with ``error``, it fails)."""
        self._attached().stop(message, error)

    def report_error(self, message: str, error: BaseException | None = None) -> None:
        """Report an error to the driver without stopping."""
        self._attached().report_error(message, error)

    def accepted_position(self) -> str | None:
        """The last position the driver accepted from this stream's ``store(position=...)``.

        None when it accepted none (a new job, or a receiver that stores no position).
        Asks the driver (one RPC; blocks up to its timeout, raises if unreachable): call
        it when (re)starting to resume after what is already stored.
        """
        return self._attached().accepted_position()

    def is_started(self) -> bool:
        """True once the supervisor started the receiver and until it stops."""
        sup = self._supervisor
        return sup is not None and sup.is_receiver_started()

    def is_stopped(self) -> bool:
        """True when the receiver is stopped (or not yet started)."""
        sup = self._supervisor
        return sup is None or sup.is_receiver_stopped()

    def handle_bad_record(
        self,
        record: bytes | str,
        reason: str,
        error: BaseException | None = None,
        key: str | None = None,
    ) -> None:
        """Count, report and handle a record the receiver cannot take, per its policy.

        ``skip`` drops it, ``dead_letter`` appends it to ``dead_letter_dir`` (with
        ``key``, where it came from, when given), ``fail`` stops the receiver for
        good and raises :class:`BadRecordError` (the driver then fails the context).
        See :mod:`spark_receivers.receiver.bad_records`.
        """
        self.bad_records += 1
        n = self.bad_records
        sample = record[:100]
        if n <= self.report_first or n % self.report_every == 0:
            message = (
                f"bad record #{n} ({self.bad_record_policy.value}): {reason}; sample {sample!r}"
            )
            log.warning("receiver %d: %s", self._stream_id, message)
            self.report_error(message, error or ReceiverError(reason))
        if self.bad_record_policy is BadRecordPolicy.DEAD_LETTER:
            if self._dead_letters is None:
                assert self.dead_letter_dir is not None
                self._dead_letters = DeadLetterWriter(self.dead_letter_dir, self._stream_id)
            self._dead_letters.write(record, reason, key)
        elif self.bad_record_policy is BadRecordPolicy.FAIL:
            # For good: a restart would meet the same record (the driver fails the context).
            failure = BadRecordError(f"bad record: {reason}; sample {sample!r}")
            failure.__cause__ = error
            self.stop(f"bad record: {reason}", failure)
            raise failure

    # --- internals ----------------------------------------------------------

    def _attached(self) -> SupervisorLike:
        sup = self._supervisor
        if sup is None:
            raise self._not_running()
        return sup

    def _not_running(self) -> StateError:
        return StateError(
            f"{type(self).__name__} is not running: store/restart/stop may only be "
            "called after the supervisor started it on an executor"
        )

    def _import_requirements(self) -> None:
        """Import what :attr:`requires` lists; :class:`MissingDependencyError` naming the extra."""
        for requirement in self.requires:
            require(requirement, type(self).__name__)

    def _attach(self, supervisor: SupervisorLike, stream_id: int, intake: Intake) -> None:
        """Run under ``supervisor`` (the lifecycle), storing into ``intake`` (the pipe)."""
        self._supervisor = supervisor
        self._stream_id = stream_id
        self._intake = intake
        self._add_text = intake.add_text

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_supervisor", None)
        state.pop("_intake", None)
        state.pop("_add_text", None)
        state.pop("_dead_letters", None)
        return state

    @property
    def name(self) -> str:
        """``<ReceiverClass>-<stream id>``, the name the driver shows."""
        return f"{type(self).__name__}-{self._stream_id}"
