"""Reproducer (Lightning 2.6.6 Fabric, torch 2.13 CPU, one process, gloo): ``fabric.load``
restores an LR scheduler passed in its state dict from a full checkpoint, but not from a
distributed one (ModelParallelStrategy's default): the sharded branch sets
``state[key] = metadata.pop(key)`` (lightning/fabric/strategies/model_parallel.py:455-460),
so the dict gets the saved state_dict and the scheduler object is left as built; the full
branch calls ``load_state_dict`` (model_parallel.py:494 -> fabric/utilities/load.py:234-235).
Prints, per checkpoint kind, the scheduler's last_epoch after the load (saved: 3).
Run: python notes/repro/lightning_fabric_load_scheduler.py"""
import tempfile

import torch
from torch import nn


def parallelize(model, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh["data_parallel"])
    return model


def build(fabric):
    model = fabric.setup_module(nn.Linear(4, 2))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)


def main() -> None:
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import ModelParallelStrategy

    for distributed in (True, False):
        fabric = Fabric(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(
            parallelize, 1, 1, save_distributed_checkpoint=distributed))
        fabric.launch()
        model, optimizer, scheduler = build(fabric)
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        path = f"{tempfile.mkdtemp()}/ckpt"
        fabric.save(path, {"model": model, "optimizer": optimizer, "scheduler": scheduler})
        model, optimizer, scheduler = build(fabric)
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        fabric.load(path, state)
        print(f"{'distributed' if distributed else 'full':>11} checkpoint: scheduler.last_epoch "
              f"= {scheduler.last_epoch} (saved 3); state['scheduler'] is now a "
              f"{type(state['scheduler']).__name__}")


if __name__ == "__main__":
    main()
