"""Reproducer (Lightning 2.6.6 Fabric, torch 2.13 CPU, one process, gloo): ``fabric.load`` of
a full checkpoint (``ModelParallelStrategy(save_distributed_checkpoint=False)``) raises
``IndexError: list index out of range`` when the saved optimizer has no per-parameter state
(plain SGD, momentum 0): ``_rekey_optimizer_state_if_needed`` reads
``list(optimizer_state_dict["state"].keys())[0]`` (lightning/fabric/strategies/
model_parallel.py:597). The same save/load as a distributed checkpoint works.
Run: python notes/repro/lightning_fabric_full_load_empty_optimizer_state.py"""
import tempfile

import torch
from torch import nn


def parallelize(model, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh["data_parallel"])
    return model


def main() -> None:
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import ModelParallelStrategy

    for distributed in (True, False):
        fabric = Fabric(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(
            parallelize, 1, 1, save_distributed_checkpoint=distributed))
        fabric.launch()
        model = fabric.setup_module(nn.Linear(4, 2))
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        path = f"{tempfile.mkdtemp()}/ckpt"
        fabric.save(path, {"model": model, "optimizer": optimizer})
        kind = "distributed" if distributed else "full"
        try:
            fabric.load(path, {"model": model, "optimizer": optimizer})
            print(f"{kind:>11} checkpoint: loaded")
        except IndexError as exc:
            print(f"{kind:>11} checkpoint: IndexError: {exc}")


if __name__ == "__main__":
    main()
