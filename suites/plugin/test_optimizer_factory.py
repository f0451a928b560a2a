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


def test_optimizer_traits_are_registered_checked_and_read_by_name():
    factory = lambda named: torch.optim.SGD([p for _, p in named], lr=1.0)  # noqa: E731
    try:
        optimizers.register_optimizer("traits~t", factory,
                                      traits=(optimizers.EMPTY_STATE_AT_START,))
        assert optimizers.optimizer_touches("traits~t", optimizers.EMPTY_STATE_AT_START)
        assert not optimizers.optimizer_touches("adam", optimizers.EMPTY_STATE_AT_START)
        with pytest.raises(ValueError, match="unknown optimizer trait 'shiny'"):
            optimizers.optimizer_touches("traits~t", "shiny")
        with pytest.raises(ValueError, match=r"optimizer 'odd~t': unknown traits \['shiny'\]"):
            optimizers.register_optimizer("odd~t", factory, traits=("shiny",))
    finally:
        optimizers.REGISTERED.pop("traits~t", None)
        optimizers._TRAITS.pop("traits~t", None)


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def net_data(step, n):
    return torch.randn(n, 6)


def make_lbfgs(named):
    return torch.optim.LBFGS([p for _, p in named], lr=0.1, max_iter=1)


def test_a_user_optimizer_whose_save_raises_gets_the_save_error_not_a_missing_file(
        fsdp_roundtrip):
    """A user's LBFGS under FSDP1: torch's save raises on every rank (entry
    fsdp1-unflattens-held-once-state, the user's optimizer seen as the zoo's of its class).
    The case says so, as the run does, instead of loading a file never written (it used
    to report ``FileNotFoundError: optim.pt`` from the load side, hiding the cause)."""
    results = fsdp_roundtrip(make_net, net_data, fsdp_version=1, plan=["0", "2"],
                             optimizer=make_lbfgs, world_sizes=["2->3"], links=1)
    full = next(r for r in results if r.case.api == "fsdp1.full")
    judged = {p: v for p, v in full.properties.items() if v.status != "n/a"}
    assert judged and all(v.status == "known" and v.known == "fsdp1-unflattens-held-once-state"
                          for v in judged.values()), {p: v.status for p, v in judged.items()}
    for v in judged.values():
        assert "fsdp1.full save call" in v.detail and "FileNotFoundError" not in v.detail
