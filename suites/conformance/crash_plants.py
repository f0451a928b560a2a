"""A planted DCP writer that commits its metadata before its data, installed in every rank
(``FSDPC_RANK_SETUP=suites.conformance.crash_plants:install``), for P16's self-test
(suites/conformance/test_crash.py).

``FileSystemWriter.write_data`` is replaced by one that first serialises this rank's items
in memory (torch's own file and item writers, as captured at install, so no kill point fires
there)
to learn where each item will lie, gathers every rank's results, lets the coordinator
write ``.metadata`` (torch's ``finish``, captured at install: the commit), waits for it,
and only then writes the data files with torch's writer. A save killed after the commit
leaves a folder whose ``.metadata`` says it is complete.
"""
from __future__ import annotations

import io
from contextlib import contextmanager

SETUP = "suites.conformance.crash_plants:install"


class _MemoryStreams:
    """``create_stream`` into memory buffers (the file system's paths otherwise)."""

    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    @contextmanager
    def create_stream(self, path, mode):
        yield io.BytesIO()


def install() -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint import filesystem as fs

    write_item, write_files = fs._write_item, fs._write_files_from_queue
    write_data, finish = fs._FileSystemWriter.write_data, fs._FileSystemWriter.finish

    def metadata_first(self, plan, planner):
        real_fs, hooked = self.fs, (fs._write_item, fs._write_files_from_queue)
        self.fs = _MemoryStreams(real_fs)
        fs._write_item, fs._write_files_from_queue = write_item, write_files
        try:
            results = write_data(self, plan, planner).wait()  # in memory: offsets only
        finally:
            self.fs = real_fs
            fs._write_item, fs._write_files_from_queue = hooked
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, results)
        if dist.get_rank() == 0:  # the coordinator of the harness's saves
            finish(self, planner.metadata, every)  # the commit, before any data
        dist.barrier()
        return write_data(self, plan, planner)  # the data, through torch's (hooked) writer

    fs._FileSystemWriter.write_data = metadata_first
