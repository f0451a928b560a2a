"""Planted torch bugs for the scale mode's self-tests: torch's pieces as read off a simulated
rank, one of them moved."""
from __future__ import annotations

from typing import Callable

from fsdp_conformance.scale import check as scale_check


def shift_piece(monkeypatch, fqn: str, moved: Callable[[tuple], tuple | None]) -> None:
    """Make the scale check read ``fqn``'s global offset as ``moved(offset)`` on every rank
    where that returns an offset (None: that rank's piece is left as torch gives it)."""
    real = scale_check.torch_pieces_of

    def shifted(sd):
        out = real(sd)
        shape, offset = out[fqn]
        new = moved(offset)
        if new is not None:
            out[fqn] = (shape, new)
        return out

    monkeypatch.setattr(scale_check, "torch_pieces_of", shifted)
