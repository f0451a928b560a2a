"""The plugin's check for a checkpoint write still in flight when ``save_fn`` returns
(``user.rank_side.pending_writes``), on real ``dcp.async_save`` in this process: an
unwaited save is seen; a waited one is not, even while torch still closes its stager in the
Future's done callback after ``result()`` returned (state_dict_saver.py:360 in torch 2.13),
which the first version of the check mistook for a write in flight."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from fsdp_conformance.user.rank_side import pending_writes

dcp = pytest.importorskip("torch.distributed.checkpoint")


def _state():
    return {"w": torch.arange(4096.0)}


def _wait_idle(timeout=10.0):
    deadline = time.monotonic() + timeout
    while pending_writes() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_waited_async_save_is_not_in_flight_while_its_stager_closes(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import staging

    closing, release = threading.Event(), threading.Event()
    original = staging.DefaultStager.close

    def slow_close(self):  # hold the done callback inside torch's own cleanup
        closing.set()
        release.wait(10)
        return original(self)

    monkeypatch.setattr(staging.DefaultStager, "close", slow_close)
    fut = dcp.async_save(_state(), checkpoint_id=str(tmp_path / "a"))
    try:
        fut.result()
        assert closing.wait(10), "async_save never closed its stager"
        assert pending_writes() == "", pending_writes()
    finally:
        release.set()
        _wait_idle()


def test_an_unwaited_async_save_is_in_flight(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import filesystem

    started, release = threading.Event(), threading.Event()
    original = filesystem.FileSystemWriter.write_data

    def slow_write(self, *args, **kwargs):  # the write itself, held open
        started.set()
        release.wait(10)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(filesystem.FileSystemWriter, "write_data", slow_write)
    fut = dcp.async_save(_state(), checkpoint_id=str(tmp_path / "b"))
    try:
        assert started.wait(10), "the write never started"
        seen = pending_writes()
        assert seen.startswith("thread ") and " in " in seen, seen
    finally:
        release.set()
        fut.result()
        _wait_idle()
