"""Files written safely: whole or not at all, never through a planted symlink, private unless asked.

Usage::

    from npu_migrate import fileio

    fileio.write_private_atomic("report.json", text)             # 0600 (or $NPU_MIGRATE_FILE_MODE)
    fileio.write_atomic("ckpt/last.pt", data, mode=fileio.default_mode())   # as umask allows
    fd = fileio.open_private_append("runs/gpu/rank0.jsonl")     # logs and recordings

Every report, error file, recording and log the toolkit writes goes through here:

* **Whole or not at all**: the bytes go to a temporary file that ``tempfile.mkstemp`` creates
  in the target's own directory (``O_CREAT | O_EXCL | O_NOFOLLOW``, a random name, mode 0600),
  are flushed to disk, and the file is renamed over the target. A reader sees the old file or
  the new one.
* **No symlink is followed**: ``O_EXCL`` refuses a name that exists, a symlink planted there
  included, and ``rename`` replaces a symlink at the target instead of writing where it points.
  Files opened for appending use ``O_NOFOLLOW``, so a symlink there is an error, not a redirect.
* **Private unless asked**: files are created 0600, readable by their owner only. Set
  ``NPU_MIGRATE_FILE_MODE`` (octal, e.g. ``0640``) to share them with a group or everyone.
"""

from __future__ import annotations

import os
import tempfile

from npu_migrate.errors import UsageError

ENV_FILE_MODE = "NPU_MIGRATE_FILE_MODE"
PRIVATE_MODE = 0o600


class FileModeError(UsageError):
    """``NPU_MIGRATE_FILE_MODE`` is not an octal file mode."""


def private_mode() -> int:
    """The mode of reports, error files, recordings and logs: 0600 unless ``NPU_MIGRATE_FILE_MODE`` says.

    Raises:
        FileModeError: the variable is set to something other than an octal mode up to 0666.
    """
    text = os.environ.get(ENV_FILE_MODE, "").strip()
    if not text:
        return PRIVATE_MODE
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o666 or not mode & 0o400:
        raise FileModeError(f"{ENV_FILE_MODE}={text!r} is not a file mode for files their owner can read: "
                            "expected octal digits such as 600 (private, the default), 640 or 644.")
    return mode


def default_mode() -> int:
    """``0666`` less this process's umask: what a plain ``open(path, "w")`` would have created."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:  # Linux >= 4.7: no global change
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it back (briefly process-wide)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a fresh temporary file in its directory, then rename.

    Args:
        path: the target; its directory must exist.
        data: bytes, or text written as UTF-8.
        mode: the file's permissions (default: :func:`private_mode`).

    Raises:
        OSError: the directory is missing or not writable, the target is a directory...; the
            temporary file is removed and the target left as it was.
    """
    target = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory, name = os.path.split(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fchmod(fh.fileno(), private_mode() if mode is None else mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_private_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """:func:`write_atomic` with the private mode, creating missing parent directories."""
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    write_atomic(path, data, mode=private_mode())


def open_private_append(path: str | os.PathLike, *, mode: int | None = None) -> int:
    """A file descriptor appending to ``path`` (created with the private mode), never through a symlink.

    Raises:
        OSError: ``ELOOP`` when ``path`` is a symlink.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.open(os.fspath(path), flags, private_mode() if mode is None else mode)
