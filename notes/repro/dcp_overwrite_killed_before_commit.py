"""Reproducer (plain torch 2.13, one process, CPU): a DCP save into the folder of an earlier
checkpoint, killed before it writes ``.metadata``, leaves a folder that ``dcp.load`` reads
without an error: the earlier save's ``.metadata`` over the killed save's data files, so
the load returns the killed save's values (every data file written), or a mix of both
saves' values (some written).

Why: ``FileSystemWriter`` overwrites an existing checkpoint by default (``overwrite=True``,
torch/distributed/checkpoint/filesystem.py:595; :653-661 only warns), writes each data file
in place under its final name (``create_stream(file_name, "wb")``, :422), and commits the
``.metadata`` last, through ``.metadata.tmp`` and a rename (``finish``, :758-790). Data files
and metadata name each other by file name and offset only, so the old metadata reads the
new files. The same lines are in torch 2.15 (:422, :657, :798).

Seen (2026-11-29): save 1 {a: 1, b: 1}, save 2 {a: 2, b: 2} killed (SIGKILL) in ``finish``
-> dcp.load gives {a: 2, b: 2}; killed after its first data file (one file per item,
``single_file_per_rank=False``) -> {a: 2, b: 1}. No error, one UserWarning at save time
("Detected an existing checkpoint ... overwriting"). The suite sees the same under FSDP1 and
FSDP2, sync and async saves, and with one file per rank (the default) a mix where one rank
is stopped before it opens its data file while the others write theirs (P16, entry
``dcp-overwrite-reads-uncommitted-data``).
Upstream: the default overwrite came with pytorch/pytorch#125877; pytorch/pytorch#192183
(open) proposes ``overwrite=False`` by default, which would make such a save raise instead.
No upstream issue about the kill itself was found.
Workaround: save each checkpoint into a new folder and mark it complete atomically (a rename
of the finished folder), loading the newest complete one (examples/crash_consistency).
Run: python notes/repro/dcp_overwrite_killed_before_commit.py"""
import os
import signal
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem as fs


def state(v: int) -> dict:
    return {"a": torch.full((4,), float(v)), "b": torch.full((4,), float(v))}


def killed_save(folder: str, value: int, after_items: int) -> None:
    """Save ``state(value)`` into ``folder``, SIGKILLed after ``after_items`` data files or,
    where every file is written first, when ``finish`` would write ``.metadata``."""
    real = fs._write_item
    written = [0]

    def write_item(*args, **kwargs):
        out = real(*args, **kwargs)
        written[0] += 1
        if written[0] >= after_items:
            args[1].flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    fs._write_item = write_item
    fs.FileSystemWriter.finish = lambda self, *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    dcp.save(state(value), storage_writer=fs.FileSystemWriter(folder, single_file_per_rank=False))


def main() -> None:
    warnings.simplefilter("ignore")
    for after_items, label in ((3, "killed in finish (every data file written)"),
                               (1, "killed after its first data file")):
        folder = tempfile.mkdtemp()
        dcp.save(state(1), storage_writer=fs.FileSystemWriter(folder, single_file_per_rank=False))
        code = subprocess.run([sys.executable, "-W", "ignore", __file__, folder,
                               str(after_items)]).returncode
        got = state(0)
        dcp.load(got, checkpoint_id=folder)
        print(f"save 2 {label}: exit {code}; dcp.load gives a={got['a'][0].item()}, "
              f"b={got['b'][0].item()} (save 1 had 1.0, save 2 2.0)")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        killed_save(sys.argv[1], 2, int(sys.argv[2]))
    else:
        main()
