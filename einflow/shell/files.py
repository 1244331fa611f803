"""Files in and out of a session: arrays (.npy, .npz), a saved session's record, program text; atomic writes.

Reading refuses what could block or never end (FIFOs, devices, a stream over :data:`LARGEST_TEXT`), checks an
array file's declared sizes against the bytes it holds and the memory limit before reading data, and never
unpickles. Writing goes through a temporary file in the same folder that replaces the target only when it is
whole (:func:`atomic_write`), so a saved session is never lost to a failed or killed save.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import stat
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

from einflow.engine.memory import format_bytes
from einflow.lang.errors import EinflowError, MemoryLimitError
from einflow.shell.records import SessionRecord, check_record
from einflow.shell.replies import SessionError, check_name, to_numpy

__all__ = ["load_arrays", "save_arrays", "atomic_write", "remove_stale_temporaries", "load_session_record",
           "read_session_record", "read_text_file", "read_bounded", "read_bounded_lines", "decode_utf8",
           "check_numeric", "open_regular", "SESSION_MEMBER", "TEMPORARY_MARK", "LARGEST_TEXT"]


def check_numeric(name: str, array: np.ndarray) -> np.ndarray:
    """``array`` when it holds numbers (bool, integers, floats, complex); a SessionError naming ``name`` else."""
    if array.dtype.kind not in "biufc":
        raise SessionError(f"{name}: expected numbers, got an array of dtype {array.dtype}")
    return array


def open_regular(path: str, what: str = "regular .npy and .npz files") -> IO[bytes]:
    """Open a file for reading, refusing anything that is not a regular file (a FIFO would block, a device
    would never end)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without blocking
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
        raise SessionError(f"{path} is {kind}; only {what} are read")
    return os.fdopen(descriptor, "rb")


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; a SessionError naming ``where``, the line and the byte when it is not.

    >>> decode_utf8(b"y = 2\\nz = \\xff", "prog.ein")
    Traceback (most recent call last):
    einflow.shell.replies.SessionError: prog.ein is not UTF-8 text: byte 0xff at line 2, column 5 cannot be decoded
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise SessionError(f"{where} is not UTF-8 text: byte 0x{data[error.start]:02x} at line {line}, column "
                           f"{column} cannot be decoded") from None


#: the most einflow text read at once: one program file, a program on stdin (``einflow run -``), one line of a
#: piped session (a program of a million statements is about 30 MiB)
LARGEST_TEXT = 64 * 2 ** 20


def _too_much_text(where: str, limit: int) -> SessionError:
    return SessionError(f"{where} holds more than {format_bytes(limit)} of text, more than einflow reads as one "
                        "program or line (an endless stream, such as /dev/zero or `yes`, is refused); split it up")


def read_bounded(stream: IO[Any], where: str, limit: int = LARGEST_TEXT) -> str:
    """The text of ``stream`` (a file, a pipe; bytes are decoded as UTF-8): at most ``limit`` bytes are read, and a
    stream that holds more is a SessionError naming ``where`` (it is not read to its end, which may never come)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise _too_much_text(where, limit)
    return data if isinstance(data, str) else decode_utf8(data, where)


def read_bounded_lines(stream: IO[Any], where: str, limit: int = LARGEST_TEXT) -> Iterator[str]:
    """The lines of ``stream`` (with their newlines), each read only when it is asked for and at most ``limit``
    bytes long; a line that is not UTF-8 is a SessionError naming its number."""
    number = 0
    while True:
        line = stream.readline(limit + 1)
        number += 1
        if not line:
            return
        if len(line) > limit:
            raise _too_much_text(f"line {number} of {where}", limit)
        if isinstance(line, str):
            yield line
            continue
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            decode_utf8(b"\n" * (number - 1) + line, where)


def read_text_file(path: str, what: str = "regular text files", limit: int = LARGEST_TEXT) -> str:
    """The UTF-8 text of a regular file (FIFOs, devices and folders are refused; so is text that is not UTF-8, and
    a file larger than ``limit`` bytes, before it is read)."""
    path = os.path.expanduser(path)
    with open_regular(path, what) as handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise _too_much_text(path, limit)
        return read_bounded(handle, path, limit)


def _npy_header(stream: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype]:
    """Read a .npy header: the declared shape and dtype (the stream is left at the start of the data)."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise SessionError(f"{where}: .npy format version {version} is not supported (1.0 and 2.0 are)")
    if dtype.hasobject:
        raise SessionError(f"{where} holds Python objects (a pickle; allow_pickle is always off): only arrays of "
                           "numbers are loaded")
    return tuple(shape), dtype


def _declared_bytes(open_member: Callable[[], Any], where: str, stored: int) -> int:
    """The bytes one array's header declares, checked against the ``stored`` bytes before any data is read."""
    with open_member() as stream:
        shape, dtype = _npy_header(stream, where)
        declared = math.prod(shape) * dtype.itemsize
        data = stored - stream.tell()
        if declared > data:
            raise SessionError(f"{where} declares an array of shape {shape} {dtype} ({format_bytes(declared)}) "
                               f"but holds only {format_bytes(max(data, 0))} of data: the file is truncated or "
                               "its header is wrong; nothing was read")
    return declared


def load_arrays(path: str, names: list[str] | None = None, limit: int | None = None) -> dict[str, np.ndarray]:
    """Arrays from a .npy file (one, under its file stem) or a .npz file (all, or the ``names`` given).

    Before any data is read, each array's header (its shape and dtype) is checked against the bytes the
    file really holds and the total against ``limit`` (bytes; ``MemoryLimitError`` when over). Pickled
    objects and non-regular files (FIFOs, devices, folders) are refused.
    """
    path = os.path.expanduser(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        with open_regular(path) as handle:
            if path.endswith(".npz"):
                with zipfile.ZipFile(handle) as archive:
                    members = {info.filename[:-4]: info for info in archive.infolist()
                               if info.filename.endswith(".npy")}
                    keys = names or list(members)
                    missing = [key for key in keys if key not in members]
                    if missing:
                        raise SessionError(f"{path} has no array {missing[0]!r} (it holds {', '.join(members)})")
                    total = 0
                    for key in keys:
                        info = members[key]
                        total += _declared_bytes(functools.partial(archive.open, info), f"{path}[{key}]",
                                                 info.file_size)
                    _check_limit(path, total, limit)
                    for key in keys:
                        with archive.open(members[key]) as member:
                            arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
            else:
                size = os.fstat(handle.fileno()).st_size
                declared = _declared_bytes(lambda: contextlib.nullcontext(handle), path, size)
                _check_limit(path, declared, limit)
                handle.seek(0)
                stem = os.path.splitext(os.path.basename(path))[0]
                arrays[names[0] if names else stem] = np.lib.format.read_array(handle, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError) as error:
        raise SessionError(f"{path} is not a valid {os.path.splitext(path)[1] or '.npy'} file ({error})") from None
    except ValueError as error:
        if isinstance(error, EinflowError):
            raise
        raise SessionError(f"{path} is not a valid .npy/.npz file ({error})") from None
    for key, array in arrays.items():
        check_name(key)
        check_numeric(key, array)
    return arrays


def _check_limit(path: str, needed: int, limit: int | None) -> None:
    if limit is not None and needed > limit:
        raise MemoryLimitError(f"{path} holds {format_bytes(needed)} of arrays, over the memory limit of "
                               f"{format_bytes(limit)}; nothing was read")


#: the member of a session's .npz (``:save FILE.npz``) that holds its statements (JSON; not an array)
SESSION_MEMBER = "einflow_session.json"
_LARGEST_RECORD = 64 * 2 ** 20


def read_session_record(path: str) -> tuple[dict[str, Any], SessionRecord] | None:
    """The record a ``:save FILE.npz`` kept beside the arrays, as JSON and checked (None for a plain .npz)."""
    path = os.path.expanduser(path)
    where = f"{path}[{SESSION_MEMBER}]"
    try:
        with open_regular(path) as handle, zipfile.ZipFile(handle) as archive:
            try:
                info = archive.getinfo(SESSION_MEMBER)
            except KeyError:
                return None
            if info.file_size > _LARGEST_RECORD:
                raise SessionError(f"{where} is {format_bytes(info.file_size)}; a session's statements are far "
                                   "smaller: the file is damaged")
            text = decode_utf8(archive.read(info), where)
    except zipfile.BadZipFile as error:
        raise SessionError(f"{path} is not a valid .npz file ({error})") from None
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise SessionError(f"{where} is not a session record ({error})") from None
    return record, check_record(record, where)


def load_session_record(path: str) -> dict[str, Any] | None:
    """The statements a ``:save FILE.npz`` kept beside the arrays (None for a plain .npz of arrays), checked:
    a damaged record or one of an unknown ``version`` is a SessionError naming the file and the field."""
    found = read_session_record(path)
    return None if found is None else found[0]


TEMPORARY_MARK = ".einflow-save-"


def _temporary_prefix(target: str) -> str:
    return f".{os.path.basename(target)}{TEMPORARY_MARK}"


def remove_stale_temporaries(target: str) -> list[str]:
    """Delete temporary files that a killed save of ``target`` left behind; return their paths.

    A temporary's name holds the id of the process writing it; one whose process no longer runs is stale.
    """
    folder, prefix = os.path.dirname(target), _temporary_prefix(target)
    removed: list[str] = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        pid_text = entry[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _running(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, entry))
            removed.append(os.path.join(folder, entry))
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """While a file is written, SIGTERM raises SystemExit (so the temporary is removed on the way out), when
    this is the main thread and nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file through a temporary file in the same folder and ``os.replace`` it into place.

    A reader (or a crash) never sees a half-written file; an existing file is replaced only on success and
    keeps its permission bits (a new file gets the umask's). A symbolic link is written *through*: the
    file it points to is replaced and the link stays. Temporaries left by a killed save (their process is
    gone) are removed by the next save of the same file.
    """
    target = os.path.realpath(os.path.expanduser(path))
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise SessionError(f"{path} exists and is not a regular file; choose another name")
    remove_stale_temporaries(target)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f"{_temporary_prefix(target)}{os.getpid()}-", suffix=".tmp",
                                             dir=os.path.dirname(target))
    except OSError as error:
        raise type(error)(error.errno, f"cannot write {path}: {error.strerror}") from None
    try:
        with _terminate_cleanly(), os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        if existing is not None:
            mode = stat.S_IMODE(existing.st_mode)
        else:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_folder(os.path.dirname(target))


def _sync_folder(folder: str) -> None:
    """Flush a folder's entries to disk, so that a crash just after a save keeps the new file's name (POSIX;
    where a folder cannot be opened or synced, as on Windows, the rename alone stands)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder or ".", os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def save_arrays(path: str, arrays: dict[str, Any], record: dict[str, Any] | None = None) -> None:
    """Save atomically: one array to ``.npy``, or named arrays to ``.npz`` (any names, no pickles); a session's
    ``record`` (its statements, JSON) goes into the .npz too."""
    host = {name: to_numpy(value) for name, value in arrays.items()}
    if path.endswith(".npz"):
        def write(stream: IO[bytes]) -> None:
            with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                for name, array in host.items():
                    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, array, allow_pickle=False)
                if record is not None:
                    archive.writestr(SESSION_MEMBER, json.dumps(record, indent=1))
    else:
        if len(host) != 1:
            raise SessionError("a .npy file holds exactly one array; use a .npz file for several")
        (array,) = host.values()

        def write(stream: IO[bytes]) -> None:
            np.lib.format.write_array(stream, array, allow_pickle=False)

    atomic_write(path, write)
