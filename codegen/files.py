"""Writing a file so that no reader ever sees half of it: the content goes
to a temp file in the same directory, which then replaces the file
(os.replace is atomic on POSIX). A crash leaves the old file or the new one,
never a truncated one; a killed writer may leave its temp file
(PATH.XXXXXXXX.tmp) behind.

The one way opgen writes what others read: the cubin cache
(codegen.compiler), `opgen build`'s outputs (codegen.build), the tuning DB
(runtime.db_file) and the bench's reports.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Union


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()      # what open() would give (mkstemp gives 0600)


def write_atomic(path: Union[str, Path], data: Union[bytes, str], durable: bool = False) -> None:
    """Replace path's content by data (str: UTF-8), atomically; a file
    there keeps its permission bits. durable: fsync the file before the
    replace and the directory after it (the tuning DB: hours of GPU time),
    so a power loss keeps one whole version too."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        mode = _FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:                     # the rename itself (best effort: not every fs allows it)
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
