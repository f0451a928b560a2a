"""The roles a user's code plays in a round trip, one Protocol each (for type checkers and
readers; nothing checks them at run time). Every one crosses to the ranks by reference
(``refs.Ref``): a module-level function or class, or a ``"package.module:name"`` string.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..cases import Case
    from ..report.run_report import CaseResult


class ModelFactory(Protocol):
    """Builds the model (torch is seeded by the case's seed before the call)."""

    def __call__(self) -> nn.Module: ...


class DataFn(Protocol):
    """The global batch of a step (ranks take rows ``r::world_size``)."""

    def __call__(self, step: int, batch: int) -> torch.Tensor: ...


class LossFn(Protocol):
    """A scalar loss that is a mean over the batch's rows."""

    def __call__(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor: ...


class OptimizerFactory(Protocol):
    """An optimizer over ``(name, param)`` pairs (several param groups allowed)."""

    def __call__(self, named_params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer: ...


class SaveFn(Protocol):
    """The user's save, on every rank: write ``optim``'s state under ``directory``."""

    def __call__(self, model: nn.Module, optim: torch.optim.Optimizer, directory: str) -> Any: ...


class LoadFn(Protocol):
    """The user's load, on every rank: restore ``optim``'s state from ``directory``."""

    def __call__(self, model: nn.Module, optim: torch.optim.Optimizer, directory: str) -> Any: ...


class Rerun(Protocol):
    """The command line that reruns just one case (what failure messages print)."""

    def __call__(self, case: Case) -> str: ...


class ResultSink(Protocol):
    """Sees each case's result as it lands (the plugin's report, progress)."""

    def __call__(self, result: CaseResult) -> None: ...
