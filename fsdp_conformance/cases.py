"""Case: a frozen, picklable, hashable description of one configuration, with a stable
readable id. It is built into model, wrapping and optimizer inside each rank."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class Case:
    """One configuration. ``plan`` names a wrapping plan of the zoo model; ``load_world_size``
    and ``load_plan`` describe where the saved state is loaded (default: where it was saved)."""

    model: str = "mlp"
    plan: str = "nested"
    optimizer: str = "adam"
    groups: int = 1
    use_orig_params: bool = False
    strategy: str = "FULL_SHARD"
    world_size: int = 2
    load_world_size: int | None = None
    load_plan: str | None = None
    api: str = "fsdp1"
    steps: int = 2
    batch: int = 12
    seed: int = 0
    dtype: str = "fp64"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def dst_world_size(self) -> int:
        return self.load_world_size or self.world_size

    @property
    def dst_plan(self) -> str:
        return self.load_plan or self.plan

    @property
    def shard_world_size(self) -> int:
        """HYBRID_SHARD shards inside groups of 2 ranks (2x2 on 4 ranks); others: everyone."""
        return 2 if self.strategy == "HYBRID_SHARD" and self.world_size >= 2 else self.world_size

    @property
    def id(self) -> str:
        orig = "orig" if self.use_orig_params else "flat"
        ws = f"ws{self.world_size}"
        if self.dst_world_size != self.world_size or self.dst_plan != self.plan:
            ws += f"->{self.dst_world_size}"
            if self.dst_plan != self.plan:
                ws += f":{self.dst_plan}"
        opt = self.optimizer + (f"x{self.groups}g" if self.groups > 1 else "")
        strat = "" if self.strategy == "FULL_SHARD" else f"/{self.strategy.lower()}"
        return (f"{self.api}/{opt}/{self.model}.{self.plan}/{orig}{strat}/{ws}/{self.dtype}"
                + (f"/seed{self.seed}" if self.seed else ""))

    def to_dict(self) -> dict:
        return asdict(self)
