"""Planted changes in torch's LR schedulers, installed in every rank (``FSDPC_RANK_SETUP=
suites.conformance.sched_plants:install``; the controller's single-process run stays
clean), chosen by ``$FSDPC_SCHED_PLANT``:

- ``last_epoch_short``: every scheduler class that defines ``load_state_dict`` restores
  ``last_epoch`` one short of what was saved;
- ``sequential_children``: ``SequentialLR.load_state_dict`` restores its own fields but not
  its child schedulers' states.

Test-only: suites/conformance/test_scheduler_plants.py.
"""
import inspect
import os

PLANT_ENV = "FSDPC_SCHED_PLANT"
SETUP = "suites.conformance.sched_plants:install"


def _one_short(orig):
    def load_state_dict(self, state_dict):
        orig(self, state_dict)
        self.last_epoch = state_dict["last_epoch"] - 1

    return load_state_dict


def _own_fields_only(self, state_dict):
    children = state_dict.pop("_schedulers")
    self.__dict__.update(state_dict)
    state_dict["_schedulers"] = children


def install() -> None:
    import torch.optim.lr_scheduler as lr

    plant = os.environ.get(PLANT_ENV, "")
    if plant == "last_epoch_short":
        for cls in vars(lr).values():
            if (inspect.isclass(cls) and issubclass(cls, lr.LRScheduler)
                    and "load_state_dict" in cls.__dict__):
                cls.load_state_dict = _one_short(cls.__dict__["load_state_dict"])
    elif plant == "sequential_children":
        lr.SequentialLR.load_state_dict = _own_fields_only
    elif plant:
        raise ValueError(f"{PLANT_ENV}={plant!r}: expected last_epoch_short or "
                         f"sequential_children")
