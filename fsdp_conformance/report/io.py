"""Report files are written atomically (temp file in the same directory, fsync, rename), so
a reader never sees half a report and an interrupted run leaves the previous one intact."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..bounds.machine import cpu_model, machine_fingerprint


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, readable like any file the user creates (mode
    0666 minus the umask; ``mkstemp``'s private 0600 is not kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """``text`` as UTF-8, by :func:`write_bytes_atomic`'s rule."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def git_commit() -> dict:
    try:
        here = Path(__file__).resolve().parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=here,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
        return {"id": sha or None, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"id": None, "dirty": None}


def machine_info() -> dict:
    """Machine, Python and torch facts that make figures comparable (pytest-benchmark style),
    with the machine's ``fingerprint`` and the CPU load when it was taken."""
    import torch

    info = {
        "node": platform.node(),
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "system": platform.system(),
        "release": platform.release(),
        "cpu_count": os.cpu_count(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
        "datetime": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit_info": git_commit(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    info["fingerprint"] = machine_fingerprint()
    return info
