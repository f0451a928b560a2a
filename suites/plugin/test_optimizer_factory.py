"""A user's optimizer factory must give the suite a torch optimizer it can read: anything
else is a TypeError naming the factory and what it returned, before any rank trains (a
trainer's container, such as torchtitan's ``OptimizersContainer``, has its own flat
``state_dict``; it used to surface as ``KeyError: 'state'`` deep in the controller)."""
import pytest
import torch

from fsdp_conformance.zoo import optimizers


class FlatContainer(torch.optim.Optimizer):
    """An optimizer whose ``state_dict`` is FQN-keyed, as a trainer's container's is."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    def state_dict(self):
        return {"layers.0.weight": {"step": 0}}


@pytest.fixture
def registered():
    names = []

    def register(name, factory):
        optimizers.REGISTERED[name] = factory
        names.append(name)

    yield register
    for n in names:
        optimizers.REGISTERED.pop(n, None)


PARAMS = [("w", torch.nn.Parameter(torch.zeros(3)))]


def test_a_container_with_its_own_state_dict_is_refused_by_name(registered):
    registered("container~t", lambda named: FlatContainer([p for _, p in named]))
    with pytest.raises(TypeError, match=r"optimizer factory 'container~t' returned "
                                        r"FlatContainer, whose state_dict\(\) has keys "
                                        r"\['layers.0.weight'\], not torch's"):
        optimizers.build_optimizer("container~t", PARAMS)


def test_something_else_than_an_optimizer_is_refused_by_name(registered):
    registered("dict~t", lambda named: {"params": named})
    with pytest.raises(TypeError, match="optimizer factory 'dict~t' returned dict, not a "
                                        "torch.optim.Optimizer"):
        optimizers.build_optimizer("dict~t", PARAMS)


def test_a_torch_optimizer_is_taken_as_it_is(registered):
    sgd = []
    registered("sgd~t", lambda named: sgd.append(torch.optim.SGD([p for _, p in named],
                                                                  lr=1.0)) or sgd[-1])
    assert optimizers.build_optimizer("sgd~t", PARAMS) is sgd[-1]
