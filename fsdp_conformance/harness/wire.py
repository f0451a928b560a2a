"""How the controller and a rank exchange messages over their pipe.

Rules
- A message is one ``pickle`` (protocol 5) of the object, sent with ``send_bytes`` and read
  with ``recv_bytes``; never ``Connection.send``/``recv``. Those use multiprocessing's
  ``ForkingPickler``, for which ``import torch`` registers reductions that move every
  tensor's storage into shared memory and pass its file descriptor to the other process
  through a socket of its own: one shared-memory file and one socket connection per
  tensor. A rank's record holds tens to hundreds of small tensors; measured on 2 cores
  (``fsdp-conformance bench harness``, "wire"): see docs/reference/benchmarks.md for the figures.
- A dense CPU tensor of type ``torch.Tensor`` (not a subclass, no Python attributes, a leaf
  or not requiring grad, no conjugate or negative bit) travels as its storage's bytes (a
  uint8 numpy array: pickle protocol 5 copies it once) with its dtype, size, stride, storage
  offset and ``requires_grad``; it arrives bitwise equal with the same view of its storage.
  Two tensors that shared a storage arrive with a copy each (the records never rely on
  aliasing: their tensors are clones). A non-leaf tensor that requires grad is refused with
  an error that says so, as ``ForkingPickler`` refused it (plain pickle would send it as a
  leaf). Every other object (a tensor subclass, a CUDA, sparse or quantized tensor
  included) is pickled as ``pickle`` does it.
- Messages are trusted: both ends are this package's processes.
"""
from __future__ import annotations

import io
import pickle
import sys
from typing import Any

PROTOCOL = 5


def _rebuild_tensor(data, dtype, size, stride, offset, requires_grad):
    """The receiving half of ``_Pickler.reducer_override``."""
    import torch

    t = torch.empty(0, dtype=dtype).set_(torch.from_numpy(data).untyped_storage(), offset,
                                        size, stride)
    return t.requires_grad_(True) if requires_grad else t


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any):
        torch = sys.modules.get("torch")  # a process without torch sends no tensor
        if torch is None or not isinstance(obj, torch.Tensor):
            return NotImplemented
        if obj.requires_grad and not obj.is_leaf:
            raise RuntimeError("a non-leaf tensor that requires grad cannot be sent to another "
                               "process (autograd does not cross it); detach() it first")
        if (type(obj) is not torch.Tensor or obj.device.type != "cpu"
                or obj.layout != torch.strided or obj.is_quantized or obj.is_conj()
                or obj.is_neg() or getattr(obj, "__dict__", None)):
            return NotImplemented
        data = torch.empty(0, dtype=torch.uint8).set_(obj.untyped_storage()).numpy()
        return _rebuild_tensor, (data, obj.dtype, tuple(obj.size()), tuple(obj.stride()),
                                 obj.storage_offset(), obj.requires_grad)


def dumps(obj: Any) -> bytes:
    """``obj`` as one message (module rules)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def send(conn, obj: Any) -> None:
    """Send ``obj`` on a multiprocessing ``Connection`` (module rules). A message that
    cannot be pickled raises here, before anything is written."""
    conn.send_bytes(dumps(obj))


def recv(conn) -> Any:
    """The next message on ``conn`` (EOFError / OSError when the other end is gone)."""
    return loads(conn.recv_bytes())
