"""What a function running on a rank gets as its first argument."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RankContext:
    """Per-rank handle passed to every function run on a pool.

    ``group`` is the pool's process group (the default group in spawned pools, the job's own
    group in attach mode). ``scratch`` is a directory private to this rank that lives as long
    as the pool. ``cache`` is a dict that persists across calls on the same live process (it
    is empty again after a rebuild): use it to keep expensive objects between calls.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device
    group: Any  # torch.distributed.ProcessGroup
    scratch: Path
    seed: int = 0
    generation: int = 0
    cache: dict = field(default_factory=dict)

    @property
    def is_controller_rank(self) -> bool:
        return self.rank == 0
