"""``ThreadedReceiver``: a receiver whose work is one worker thread, with restarts and backoff.

Most receivers have the same shape: ``on_start`` starts one thread that reads
a source and stores what it reads, ``on_stop`` tells that thread to stop,
wakes it out of its blocking read and waits for it, and a failure restarts
the receiver after a delay that grows while the source stays broken. This
module writes that shape once; a subclass implements :meth:`receive` (the
body of the thread) and, where a read blocks, :meth:`interrupt`.

The lifecycle of one run, in order:

1. ``on_start`` (the supervisor's thread): :meth:`reset_runtime`, then a new
   stop event and a new worker thread ``<thread_name_prefix>-<stream id>``
   running :meth:`receive`; returns at once.
2. The worker runs :meth:`receive` until it returns or raises.
3. ``on_stop`` (the supervisor's thread, or the worker itself when the
   receiver stops itself): sets the stop event, calls :meth:`interrupt`, then
   joins the worker for at most ``stop_timeout_s`` (never when called from
   the worker) and logs a warning if it is still running.

When :meth:`receive` ends while the receiver is not stopping, by an
exception or by returning (the source ended: a receiver lives until it is
stopped), the worker calls :meth:`Receiver.restart` with the next backoff
delay; the supervisor then runs ``on_stop``, waits that delay and runs
``on_start`` again. An exception while stopping is expected (a closed socket
fails its read) and is logged at info level only.

Backoff: capped exponential with *equal jitter*. The n-th consecutive failure
waits ``d/2 + uniform(0, d/2)`` ms with ``d = min(max_backoff_ms,
backoff_base_ms * 2**(n-1))``, so between half and all of ``d``. Equal rather
than full jitter (``uniform(0, d)``) because a receiver's restart is not
free (the supervisor deregisters it from the driver and registers it again):
keeping half of the exponential delay means a broken source is never retried
in a tight loop, while the random half still spreads out receivers that failed
together (a broker restart seen by every receiver at once). The failure count
goes back to zero only when the subclass calls :meth:`mark_healthy`, once the
source proved itself (connected, first data read), not on a mere start.

``include_timestamp=True``, for subclasses that set :attr:`supports_timestamp`
and store through :meth:`store_records`, adds a ``timestamp`` column (UTC) to
the schema (:mod:`spark_receivers.receiver.source_support`).
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any, ClassVar

import pyarrow as pa

from spark_receivers.config_checks import check_max_record_bytes
from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver import source_support
from spark_receivers.receiver.bad_records import DEFAULT_MAX_RECORD_BYTES
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import is_default
from spark_receivers.util.options import require_positive_numbers

log = logging.getLogger(__name__)

# Exponents above this give delays far above any sensible cap: stop doubling there.
_MAX_DOUBLINGS = 32
_SHARED_RANDOM = random.Random()


class _Worker(threading.Thread):
    """The worker thread of one run, carrying that run's stop event.

    A worker that outlived its ``on_stop`` (the join timed out) keeps seeing its
    own, set, event even after ``on_start`` began a new run with a fresh one.
    """

    def __init__(self, receiver: ThreadedReceiver, stop_event: threading.Event, name: str) -> None:
        super().__init__(target=receiver._work, name=name, daemon=True)
        self.receiver = receiver
        self.stop_event = stop_event


class ThreadedReceiver(Receiver):
    r"""A receiver that runs :meth:`receive` on one worker thread (see the module doc).

    Implement :meth:`receive`: read the source and :meth:`store` what it gives
    until :attr:`stopping` is True (or :meth:`wait` returns True), then return.
    Raise to have the receiver restarted with backoff. Call
    :meth:`mark_healthy` once the source works, so that the next failure waits
    about ``backoff_base_ms`` again. Where it helps, override
    :meth:`interrupt` (wake a ``receive`` blocked on what the stop event cannot
    wake: shut its socket down), :meth:`reset_runtime` (create the state a run
    needs: queues, locks), :meth:`describe` or :meth:`restart_message` (say
    what failed), and list in :attr:`transient_attrs` the attributes that must
    not travel to the executor (connections, handles).

    Options (keyword only, the rest go to :class:`Receiver`): the backoff of
    the restarts after failures, ``backoff_base_ms`` (first delay, default
    500) and ``max_backoff_ms`` (cap, default 30 000); ``stop_timeout_s``, how
    long ``on_stop`` waits for the worker (default 30); ``rng``, the
    :class:`random.Random` of the jitter (default a shared one; pass a seeded
    one in tests); ``include_timestamp`` (see the module doc);
    ``max_record_bytes``, the longest record the subclass takes (see
    :attr:`record_limit`).

    Thread contract: :meth:`receive` runs on the worker thread
    ``<thread_name_prefix>-<stream id>``, a new one for each start; ``on_start``
    returns at once; ``on_stop`` blocks until the worker ended or
    ``stop_timeout_s`` passed. :attr:`stopping`, :meth:`wait`,
    :meth:`mark_healthy` and :meth:`restart` may be called from any thread.

    Example::

        class Lines(ThreadedReceiver):
            thread_name_prefix = "lines"
            transient_attrs = ("_sock",)
            _sock = None

            def receive(self):
                with socket.create_connection(("feed", 9999)) as sock:
                    self._sock = sock
                    if self.stopping:      # interrupt() may have run before _sock was set
                        return
                    for line in sock.makefile("r", encoding="utf-8"):
                        self.store(line.rstrip("\n"))
                        self.mark_healthy()
                # returned while not stopping: the feed closed; restarted with backoff

            def interrupt(self):
                if self._sock is not None:
                    with contextlib.suppress(OSError):
                        self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read
    """

    #: The worker thread is named ``<thread_name_prefix>-<stream id>``.
    thread_name_prefix: ClassVar[str] = "receiver"
    #: Attributes dropped when the receiver is pickled (connections, handles, caches).
    transient_attrs: ClassVar[tuple[str, ...]] = ()
    #: True for a subclass that stores through :meth:`store_records` (``include_timestamp``).
    supports_timestamp: ClassVar[bool] = False

    # Class-level defaults, so that a subclass that forgets super().__init__() works.
    backoff_base_ms: int = 500
    max_backoff_ms: int = 30_000
    stop_timeout_s: float = 30.0
    _rng: random.Random | None = None
    _failures: int = 0
    _thread: threading.Thread | None = None
    _stop_event: threading.Event | None = None
    include_timestamp: bool = False
    max_record_bytes: int | None = None
    _record_schema: pa.Schema | None = None

    def __init__(
        self,
        *,
        backoff_base_ms: int = 500,
        max_backoff_ms: int = 30_000,
        stop_timeout_s: float = 30.0,
        rng: random.Random | None = None,
        include_timestamp: bool = False,
        max_record_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if max_record_bytes is not None:
            check_max_record_bytes(max_record_bytes, "max_record_bytes")
        self.max_record_bytes = max_record_bytes
        if include_timestamp:
            if not self.supports_timestamp:
                msg = f"{type(self).__name__} does not support include_timestamp=True"
                raise ConfigError(msg)
            self._record_schema = self.schema
            self.schema = source_support.with_timestamp(self.schema, type(self).__name__)
            self.include_timestamp = True
        require_positive_numbers(
            backoff_base_ms=backoff_base_ms,
            max_backoff_ms=max_backoff_ms,
            stop_timeout_s=stop_timeout_s,
        )
        self.backoff_base_ms = backoff_base_ms
        self.max_backoff_ms = max_backoff_ms
        self.stop_timeout_s = stop_timeout_s
        self._rng = rng

    # --- to implement -------------------------------------------------------

    def receive(self) -> None:
        """Read the source and store what it gives until :attr:`stopping`; then return.

        Runs on the worker thread. Blocking is expected, but every blocking
        call must end soon after the receiver is told to stop: wait with
        :meth:`wait` rather than ``time.sleep``, use timeouts, or make
        :meth:`interrupt` wake the call. Raising restarts the receiver with
        backoff (unless it is stopping); returning while not stopping restarts
        it too, as a source that ended (see :meth:`restart_message`).
        """
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake :meth:`receive` out of a blocking call (close its socket, its client).

        Called by ``on_stop`` after the stop event is set and before the join,
        on the thread that stops the receiver (the supervisor's, or the worker
        itself). Must not block. It may run before ``receive`` published the
        resource it closes, or after ``receive`` ended: so ``receive`` checks
        :attr:`stopping` right after publishing it, and this method tolerates
        missing or already closed resources. The default does nothing.
        """

    def reset_runtime(self) -> None:
        """Create fresh per-run state; called by ``on_start`` and after unpickling.

        Runs before the worker thread exists, on the supervisor's (or the
        unpickling) thread: assign empty state (queues, locks, ``None``
        handles), open nothing. The default does nothing.
        """

    def describe(self) -> str:
        """What the worker does, as restart messages name it (default: the class name).

        For example ``f"tailing {self.directory}"``: a failure is then restarted
        with ``"tailing /var/log failed: <error>"``.
        """
        return type(self).__name__

    def restart_message(self, error: Exception | None) -> str:
        """The message of the restart after :meth:`receive` raised ``error`` (None: returned).

        Sent to the driver with the restart. A :class:`ReceiverError` is taken
        as the whole message (``raise ReceiverError(f"cannot connect to {addr}")
        from e``); any other error gives ``"<describe()> failed: <error>"``; a
        return gives ``"<describe()> ended: receive() returned while not
        stopping"``.
        """
        if error is None:
            return f"{self.describe()} ended: receive() returned while not stopping"
        if isinstance(error, ReceiverError):
            return str(error)
        return f"{self.describe()} failed: {error}"

    # --- to call ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once this run is told to stop (or the receiver is not running).

        That is: ``on_stop`` began, :meth:`restart` or :meth:`stop` was called,
        or the supervisor reports the receiver stopped. Seen from a worker that
        outlived its run, it stays True. Any thread; never blocks.
        """
        event = self._event()
        return event is None or event.is_set() or self.is_stopped()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until this run is told to stop, or ``timeout_s`` passes; return :attr:`stopping`.

        The way for :meth:`receive` to pause (``while not self.wait(1.0): poll()``):
        unlike ``time.sleep`` it ends as soon as ``on_stop`` begins.
        """
        event = self._event()
        if event is None:
            return True
        event.wait(timeout_s)
        return self.stopping

    def mark_healthy(self) -> None:
        """Reset the failure count: the next failure waits about ``backoff_base_ms`` again.

        Call it once the source proved to work (connected, data read). Any
        thread; cheap enough to call for every read.
        """
        self._failures = 0

    @property
    def record_limit(self) -> int:
        """The longest record this receiver takes, in bytes (longer ones are bad records).

        ``max_record_bytes`` when given, else the context's
        ``spark.receivers.receiver.maxRecordBytes`` (1 MiB unless set); see
        :mod:`spark_receivers.receiver.bad_records`.
        """
        if self.max_record_bytes is not None:
            return self.max_record_bytes
        config = getattr(self._supervisor, "config", None)
        return int(getattr(config, "receiver_max_record_bytes", DEFAULT_MAX_RECORD_BYTES))

    @property
    def record_schema(self) -> pa.Schema:
        """The schema of the records the receiver makes: :attr:`schema` without ``timestamp``."""
        return self._record_schema if self._record_schema is not None else self.schema

    @property
    def default_records(self) -> bool:
        """True when a record is one string (the default :attr:`record_schema`)."""
        return is_default(self.record_schema)

    def store_records(
        self,
        records: list[Any] | pa.Array | pa.Table,
        *,
        reliable: bool = False,
        times_us: Any = None,
        position: str | None = None,
    ) -> None:
        """``store(records, reliable=reliable, position=position)``, with ``timestamp`` if asked.

        ``records`` is a list of records, an Arrow array: the one column of the
        default :attr:`record_schema` (as :func:`~spark_receivers.receiver.lines.split_lines`
        makes it), or an Arrow table of :attr:`record_schema`; an array or a table is
        stored as one table without a Python object per record.
        With ``include_timestamp`` the records become one Arrow table with the
        ``timestamp`` column: ``times_us`` is one time for all (default: now) or
        one per record, in microseconds since the epoch. Blocks as :meth:`store`.
        """
        if len(records) == 0:
            return
        if self.include_timestamp:
            table = source_support.table_with_times(records, self.record_schema, times_us)
            self.store(table, reliable=reliable, position=position)
        elif isinstance(records, pa.Array):
            table = pa.Table.from_arrays([records], schema=self.schema)
            self.store(table, reliable=reliable, position=position)
        elif isinstance(records, pa.Table):
            self.store(records, reliable=reliable, position=position)
        else:
            self.store(records, reliable=reliable, position=position)

    def durable_name(self, prefix: str = "spark-receivers") -> str:
        """A name unique to this job's stream, stable across restarts (see ``source_support``)."""
        return source_support.durable_name(self._supervisor, self.stream_id, prefix)

    @property
    def consecutive_failures(self) -> int:
        """Failures since the last :meth:`mark_healthy` (each one restarted the receiver)."""
        return self._failures

    def restart(
        self, message: str, error: BaseException | None = None, delay_ms: int | None = None
    ) -> None:
        """Restart the receiver (see :meth:`Receiver.restart`); this run starts stopping at once.

        Sets the run's stop event first, so that :meth:`receive` winds down and
        its return is not taken for a source that ended.
        """
        event = self._event()
        if event is not None:
            event.set()
        super().restart(message, error, delay_ms)

    def stop(self, message: str, error: BaseException | None = None) -> None:
        """Stop the receiver for good (see :meth:`Receiver.stop`); this run stops at once."""
        event = self._event()
        if event is not None:
            event.set()
        super().stop(message, error)

    # --- the lifecycle, implemented once -----------------------------------------------

    def on_start(self) -> None:
        """Reset the per-run state and start the worker thread; returns at once."""
        self.reset_runtime()
        event = threading.Event()
        worker = _Worker(self, event, f"{self.thread_name_prefix}-{self.stream_id}")
        self._stop_event = event
        self._thread = worker
        worker.start()

    def on_stop(self) -> None:
        """Set the stop event, :meth:`interrupt`, and join the worker (``stop_timeout_s``).

        Never joins when called from the worker itself (a receiver that stops
        itself). A worker that does not end in time is logged and left behind
        (a daemon thread): it keeps seeing :attr:`stopping` as True.
        """
        event, thread = self._stop_event, self._thread
        if event is not None:
            event.set()
        try:
            self.interrupt()
        except Exception:
            log.warning("receiver %d: interrupt() failed", self.stream_id, exc_info=True)
        if thread is None or thread is threading.current_thread():
            return
        thread.join(self.stop_timeout_s)
        if thread.is_alive():
            log.warning(
                "receiver %d: worker thread %s did not stop within stop_timeout_s=%s; "
                "left running (a daemon), it sees the receiver as stopping",
                self.stream_id,
                thread.name,
                self.stop_timeout_s,
            )

    def _event(self) -> threading.Event | None:
        current = threading.current_thread()
        if isinstance(current, _Worker) and current.receiver is self:
            return current.stop_event
        return self._stop_event

    def _work(self) -> None:
        error: Exception | None = None
        try:
            self.receive()
        except Exception as e:  # noqa: BLE001 - a failure restarts the receiver, logged below
            error = e
        if self.stopping:
            if error is not None:
                log.info(
                    "receiver %d: stopped while receiving: %s: %s",
                    self.stream_id,
                    type(error).__name__,
                    error,
                )
            return
        message = self.restart_message(error)
        delay_ms = self.next_backoff_ms()
        # The stack once per run of failures: a source that stays down is one line a retry.
        first = self._failures == 1
        log.warning(
            "receiver %d: %s; restarting in %d ms (failure %d in a row%s)",
            self.stream_id,
            message,
            delay_ms,
            self._failures,
            "" if first or error is None else "; the stack was logged at the first",
            exc_info=error if first else None,
        )
        self.restart(message, error, delay_ms)

    def next_backoff_ms(self) -> int:
        """Count one more failure and return its delay in ms (equal jitter, see the module doc).

        Called by the worker before each restart after a failure; call it
        yourself only when you restart the receiver from elsewhere.
        """
        self._failures += 1
        doublings = min(self._failures - 1, _MAX_DOUBLINGS)
        ceiling = min(self.backoff_base_ms * 2**doublings, self.max_backoff_ms)
        half = ceiling / 2
        rng = self._rng if self._rng is not None else _SHARED_RANDOM
        return int(half + rng.uniform(0, half))

    # --- pickling -------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_thread", "_stop_event", "_failures", *self.transient_attrs):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.reset_runtime()
