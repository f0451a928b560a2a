"""The model zoo: small models, wrapping plans and optimizers, built by name inside ranks."""
from .models import (MODELS, build_model, loss_of, make_batch, model_spec, register_model,
                     train_step)
from .optimizers import (FUSED, OPTIMIZERS, build_optimizer, build_scheduler, impl_kwargs,
                         register_optimizer)

__all__ = ["FUSED", "MODELS", "OPTIMIZERS", "build_scheduler", "impl_kwargs", "build_model", "build_optimizer", "loss_of", "make_batch",
           "model_spec", "register_model", "register_optimizer", "train_step"]
