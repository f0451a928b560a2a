"""The model zoo: small models, wrapping plans and optimizers, built by name inside ranks."""
from .models import (MODELS, TP_MODELS, build_model, freeze_at_save, frozen_at_save, loss_of,
                     make_batch, model_shapes, model_spec, register_model, runs_on, train_step)
from .optimizers import (ALL_OPTIMIZERS, FUSED, MORE_OPTIMIZERS, OPTIMIZERS, build_optimizer, build_scheduler, impl_kwargs,
                         register_optimizer, scheduler_state)

__all__ = ["ALL_OPTIMIZERS", "FUSED", "MORE_OPTIMIZERS", "MODELS", "TP_MODELS", "OPTIMIZERS", "build_scheduler", "impl_kwargs", "build_model", "build_optimizer", "model_shapes", "freeze_at_save", "frozen_at_save", "loss_of", "make_batch",
           "model_spec", "register_model", "register_optimizer", "runs_on", "scheduler_state", "train_step"]
