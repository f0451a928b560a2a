"""Writing a conversion's output: a new directory of per-rank files (plus
``manifest.json``) or a new full-dict file, all or nothing.

Rules
-----
The output path must not exist (nor be a dangling link) nor be an input; nothing is ever
written over the input or any existing path (:class:`~.errors.UsageError`). Files are
written into a temporary sibling (``.<name>.tmp-*``), fsynced, and put in place with one
no-replace rename (a directory: ``renameat2(RENAME_NOREPLACE)`` where the kernel has it;
a file: ``link`` + ``unlink``), so the output appears complete or not at all.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .errors import UsageError
from .inputs import DEFAULT_PATTERN


def check_output_path(out: str | os.PathLike, inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """``out`` as a Path; :class:`UsageError` if it exists (a dangling link included) or is
    an input. Its parent directory is created if missing."""
    out = Path(out)
    for inp in inputs:
        if Path(inp).resolve() == out.resolve():
            raise UsageError("refusing to write over the input", path=out)
    if os.path.lexists(out):
        raise UsageError("refusing to write over an existing path; choose a new one", path=out)
    return out


_RENAME_NOREPLACE = 1


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError if ``dst`` exists."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        fn = None
    if fn is not None:
        AT_FDCWD = -100
        rc = fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):  # fallback: check, then rename (not race-free)
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    os.rename(src, dst)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _save(obj: Any, path: Path) -> int:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def write_rank_files(out_dir: str | os.PathLike, dicts: Sequence[Mapping], *,
                     pattern: str = DEFAULT_PATTERN, manifest: Mapping | None = None) -> int:
    """Writes ``dicts[r]`` to ``out_dir/pattern.format(rank=r)`` (plus ``manifest.json``),
    all or nothing; returns the bytes written. ``out_dir`` must not exist."""
    out_dir = check_output_path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        total = 0
        for r, d in enumerate(dicts):
            total += _save(d, tmp / pattern.format(rank=r))
        if manifest is not None:
            text = json.dumps(manifest, indent=2, default=str) + "\n"
            (tmp / "manifest.json").write_text(text)
            total += len(text.encode())
        _fsync_dir(tmp)
        try:
            rename_noreplace(tmp, out_dir)
        except FileExistsError as e:
            raise UsageError("refusing to write over a path that appeared meanwhile", path=out_dir) from e
        _fsync_dir(out_dir.parent)
        return total
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_full_file(out_file: str | os.PathLike, full: Mapping) -> int:
    """``torch.save(full)`` to ``out_file`` (which must not exist), all or nothing; bytes."""
    out_file = check_output_path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_file.name}.tmp-", dir=out_file.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        n = _save(full, tmp)
        try:
            os.link(tmp, out_file)  # fails if out_file exists: no-replace
        except FileExistsError as e:
            raise UsageError("refusing to write over a path that appeared meanwhile", path=out_file) from e
        _fsync_dir(out_file.parent)
        return n
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["check_output_path", "rename_noreplace", "write_full_file", "write_rank_files"]
