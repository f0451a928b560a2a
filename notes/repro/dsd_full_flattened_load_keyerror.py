"""torch 2.13: set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True)
raises KeyError for the flattened full dict that
get_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) returned.
It is not specific to FSDP2: a plain nn.Module at world size 1 raises the same. Without the
flatten option the same calls load (shown first). Workaround (shown last): the flattened dict
loads with flatten_optimizer_state_dict=False (a dict without a "state" key is unflattened
whatever the option says, state_dict.py:1095-1102), every tensor state equal to the saved;
betas come back as a list, as on every full-dict load (entry dsd-full-load-tuple-to-list).
  - without broadcast_from_rank0 (every rank passes the dict): every rank raises
    KeyError: 'param_groups.0.params.0' in _unflatten_state_dict (_state_dict_utils.py:828);
  - with broadcast_from_rank0=True (rank 0 passes the dict, the others {}): rank 0 raises
    KeyError: 'state' in Optimizer.load_state_dict (optimizer.py:997), the others
    KeyError: 'param_groups' (state_dict.py:1179).

Run: python notes/repro/dsd_full_flattened_load_keyerror.py
     (1 process with a plain nn.Module, then 2 processes with FSDP2; gloo, CPU)

Output seen on torch 2.13.0+cpu (PYTHONWARNINGS=ignore; the ranks' lines interleave):
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=True flatten=False: loaded
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=True flatten=True: KeyError 'state' in load_state_dict (optimizer.py:997)
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=False flatten=False: loaded
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=False flatten=True: KeyError 'param_groups.0.params.0' in _unflatten_state_dict (_state_dict_utils.py:828)
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=False flatten=True:   _distribute_state_dict added 16 keys the local dict lacked, e.g. ['param_groups.0.amsgrad', 'param_groups.0.betas.0', 'param_groups.0.betas.1']
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=True: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']
  plain nn.Module ws 1 rank 0 broadcast_from_rank0=False: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']
  FSDP2 ws 2 rank 0 broadcast_from_rank0=True flatten=False: loaded
  FSDP2 ws 2 rank 1 broadcast_from_rank0=True flatten=False: loaded
  FSDP2 ws 2 rank 1 broadcast_from_rank0=True flatten=True: KeyError 'param_groups' in _load_optim_state_dict (state_dict.py:1179)
  FSDP2 ws 2 rank 0 broadcast_from_rank0=True flatten=True: KeyError 'state' in load_state_dict (optimizer.py:997)
  FSDP2 ws 2 rank 1 broadcast_from_rank0=False flatten=False: loaded
  FSDP2 ws 2 rank 0 broadcast_from_rank0=False flatten=False: loaded
  FSDP2 ws 2 rank 0 broadcast_from_rank0=False flatten=True: KeyError 'param_groups.0.params.0' in _unflatten_state_dict (_state_dict_utils.py:828)
  FSDP2 ws 2 rank 0 broadcast_from_rank0=False flatten=True:   _distribute_state_dict added 16 keys the local dict lacked, e.g. ['param_groups.0.amsgrad', 'param_groups.0.betas.0', 'param_groups.0.betas.1']
  FSDP2 ws 2 rank 1 broadcast_from_rank0=False flatten=True: KeyError 'param_groups.0.params.0' in _unflatten_state_dict (_state_dict_utils.py:828)
  FSDP2 ws 2 rank 1 broadcast_from_rank0=False flatten=True:   _distribute_state_dict added 16 keys the local dict lacked, e.g. ['param_groups.0.amsgrad', 'param_groups.0.betas.0', 'param_groups.0.betas.1']
  FSDP2 ws 2 rank 0 broadcast_from_rank0=True: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']
  FSDP2 ws 2 rank 1 broadcast_from_rank0=True: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']
  FSDP2 ws 2 rank 0 broadcast_from_rank0=False: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']
  FSDP2 ws 2 rank 1 broadcast_from_rank0=False: the flattened dict loaded with flatten=False: loaded; every tensor state equal to the saved: True; other values that differ: ['betas: (0.9, 0.999) -> [0.9, 0.999]']

Mechanism (2.13, torch/distributed/checkpoint/state_dict.py): _load_optim_state_dict first
turns the flattened dict it is given (no "state" key) back into the nested form
(_unflatten_optim_state_dict, :1100-1102). In the full_state_dict branch (:1140) it reads the
rank's own local dict with _get_optim_state_dict (:1142), which flattens that one, the option
being set (:974-977). Both go through _flatten_state_dict (:1158-1159), so their keys differ:
the nested dict gives 'param_groups.0.lr', 'param_groups.0.params.0', ..., the local flattened
one 'param_groups.0.weight.lr', ...; their state keys ('state.0.weight.exp_avg') coincide.
  - Without broadcast, _distribute_state_dict (:1163) copies every non-tensor value of the
    full dict into the local dict under its own key, whether the local dict has that key or not
    (torch/distributed/_state_dict_utils.py:711-712; the spy above counts 16 such keys), so
    the loop at :1168-1175, which adds the keys the local dict lacks together with their
    path in local_osd_mapping, skips them; _unflatten_state_dict (:1176) then finds no path
    for 'param_groups.0.params.0' and raises KeyError.
  - With broadcast, _broadcast_state_dict (:1161) writes a non-tensor value only into keys
    the local dict has (_state_dict_utils.py:670-673); on rank 0 the loop adds the nested dict's
    param_groups keys, while the state keys keep the local dict's one-level path, so the dict
    passed to optim.load_state_dict (:1186) has "param_groups" but no "state": KeyError:
    'state' (optimizer.py:997). The other ranks pass {}, nothing is added, and
    optim_state_dict["param_groups"] (:1179) raises KeyError: 'param_groups'.
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def run(rank: int, world_size: int, port: int, fsdp: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    import torch.distributed.checkpoint.state_dict as dsd
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    added = []
    distribute = dsd._distribute_state_dict

    def spy(full, local, *args, **kwargs):  # which keys it adds to the local dict
        before = set(local)
        distribute(full, local, *args, **kwargs)
        added[:] = sorted(set(local) - before)

    dsd._distribute_state_dict = spy

    def trained():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        if fsdp:
            fully_shard(model)
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        optim.step()
        return model, optim

    def build_other():  # other values, so that an equal result means it was loaded
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        if fsdp:
            fully_shard(model)
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        optim.step()
        return model, optim

    import traceback

    kind = "FSDP2" if fsdp else "plain nn.Module"
    for broadcast in (True, False):
        for flatten in (False, True):
            model, optim = trained()
            full = get_optimizer_state_dict(model, optim, options=StateDictOptions(
                full_state_dict=True, cpu_offload=broadcast,
                flatten_optimizer_state_dict=flatten))
            model2, optim2 = trained()
            opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast,
                                    flatten_optimizer_state_dict=flatten)
            what = f"{kind} ws {world_size} rank {rank} broadcast_from_rank0={broadcast} " \
                   f"flatten={flatten}"
            added.clear()
            try:
                set_optimizer_state_dict(model2, optim2,
                                         full if rank == 0 or not broadcast else {},
                                         options=opts)
                print(f"{what}: loaded", flush=True)
            except KeyError as exc:
                last = traceback.extract_tb(exc.__traceback__)[-1]
                print(f"{what}: KeyError {exc} in {last.name} "
                      f"({os.path.basename(last.filename)}:{last.lineno})", flush=True)
            if added:
                print(f"{what}:   _distribute_state_dict added {len(added)} keys the local dict "
                      f"lacked, e.g. {added[:3]}", flush=True)
    # the workaround: the flattened full dict, loaded without flatten_optimizer_state_dict
    def flat_full(m, o):
        return get_optimizer_state_dict(m, o, options=StateDictOptions(
            full_state_dict=True, flatten_optimizer_state_dict=True))

    for broadcast in (True, False):
        model, optim = trained()
        full = get_optimizer_state_dict(model, optim, options=StateDictOptions(
            full_state_dict=True, cpu_offload=broadcast, flatten_optimizer_state_dict=True))
        model2, optim2 = build_other()
        set_optimizer_state_dict(model2, optim2, full if rank == 0 or not broadcast else {},
                                 options=StateDictOptions(full_state_dict=True,
                                                          broadcast_from_rank0=broadcast))
        want, got = flat_full(model, optim), flat_full(model2, optim2)
        tensors = all(torch.equal(v, got[k]) for k, v in want.items()
                      if isinstance(v, torch.Tensor))
        other = sorted({f"{k.rsplit('.', 1)[-1]}: {want[k]!r} -> {got.get(k)!r}"
                        for k in want if not isinstance(want[k], torch.Tensor)
                        and want[k] != got.get(k)})
        print(f"{kind} ws {world_size} rank {rank} broadcast_from_rank0={broadcast}: the "
              f"flattened dict loaded with flatten=False: loaded; every tensor state equal to "
              f"the saved: {tensors}; other values that differ: {other}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    print(f"torch {torch.__version__}")
    for ws, fsdp in ((1, False), (2, True)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(ws, port, fsdp), nprocs=ws)
