"""A job's identity: a random id its checkpoint keeps, the key of its durable source names.

A source that keeps state per client (an MQTT broker's session per client id, a
Redis group's pending entries per consumer) needs a name that is the same in
every restart of one job and different for every other job. The path of the
checkpoint directory is not such a name: every pod of a Kubernetes deployment
mounts its own volume at the same path, and two jobs named after that path
share one MQTT session and kick each other off the broker. So the first start of
a job with a checkpoint writes a random id into it (``<checkpoint>/job-id``,
see :class:`~spark_receivers.wal.layout.CheckpointLayout`), and every later
start from that checkpoint, wherever it is mounted, reads it back.
``spark.receivers.jobId`` set by hand wins over it.

Driver side, at context start; plain functions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets

import pyarrow.fs as pafs

from spark_receivers.errors import CheckpointError
from spark_receivers.wal.layout import CheckpointLayout

__all__ = ["checkpoint_job_id", "new_job_id"]

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"[0-9a-f]{16}")


def new_job_id() -> str:
    """16 random hex digits (64 bits): no two jobs ever draw the same."""
    return secrets.token_hex(8)


def checkpoint_job_id(checkpoint_dir: str) -> str:
    """The id kept in ``checkpoint_dir`` (see the module doc); written there on the first call.

    A local directory gets it atomically (a temporary file linked into place, so two
    starts racing on one directory agree on one id); an object store gets it with one
    write. An unreadable or malformed file is replaced by a new id, with a warning.
    Raises :class:`CheckpointError` when the directory cannot be written.
    """
    layout = CheckpointLayout(checkpoint_dir)
    path = layout.job_id_file
    found = _read(layout.filesystem, path)
    if found is not None:
        return found
    job_id = new_job_id()
    try:
        if layout.is_local:
            _create_local(path, job_id)
        else:
            layout.filesystem.create_dir(layout.root, recursive=True)
            with layout.filesystem.open_output_stream(path) as f:
                f.write(job_id.encode())
    except OSError as e:
        msg = f"cannot write the job id of checkpoint {checkpoint_dir} to {path}: {e}"
        raise CheckpointError(msg) from e
    found = _read(layout.filesystem, path)
    if found is None:
        msg = f"the job id written to {path} cannot be read back"
        raise CheckpointError(msg)
    log.info("checkpoint %s: new job id %s", checkpoint_dir, found)
    return found


def _read(fs: pafs.FileSystem, path: str) -> str | None:
    """The id in ``path``; None when there is none (or a torn, malformed one: it is replaced)."""
    try:
        with fs.open_input_stream(path) as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        msg = f"cannot read the job id file {path}: {e}"
        raise CheckpointError(msg) from e
    if _JOB_ID.fullmatch(text):
        return text
    log.warning("the job id file %s holds %r, not a job id: writing a new one", path, text[:20])
    with contextlib.suppress(OSError):
        fs.delete_file(path)
    return None


def _create_local(path: str, job_id: str) -> None:
    """Write ``path`` with ``job_id`` unless it exists: durable, never half-written."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{new_job_id()}.tmp"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(job_id)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another start won: its id is read back
            os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
