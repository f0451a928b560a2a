"""The model zoo: small models, wrapping plans and optimizers, built by name inside ranks."""
from .models import MODELS, build_model, loss_of, make_batch, model_spec
from .optimizers import OPTIMIZERS, build_optimizer

__all__ = ["MODELS", "OPTIMIZERS", "build_model", "build_optimizer", "loss_of", "make_batch",
           "model_spec"]
