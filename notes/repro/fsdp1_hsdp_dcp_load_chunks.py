# Reproducer and mechanism check (torch 2.13.0, CPU, gloo, 4 ranks): FSDP1 HYBRID_SHARD
# (2 replicas x 2-rank shard groups) + optim_state_dict SHARDED + dcp.save, loaded with
# load_sharded_optimizer_state_dict + optim_state_dict_to_load, loads the wrong state.
# Mechanism (each step checked bitwise on all 4 ranks by this script): the load chunks each
# unflattened state T (R rows) along dim 0 over the GLOBAL world (checkpoint/optimizer.py:
# 309-316, fsdp/_shard_utils.py:41-45): rank g holds torch.chunk(T, 4)[g] or nothing;
# optim_state_dict_to_load then all-gathers it over the 2-rank SHARD group
# (fsdp/_optim_utils.py:603-607 -> _state_dict_utils.py:32-67), each member's 4-way chunk
# flattened and zero-padded to the 2-way chunk size ceil(R/2)*n//R: shard group {a, b} sees
# T' = [chunk_a | zeros | chunk_b | zeros][:n], flattens it and keeps its 2-way shard.
# Known entry: dcp-sharded-optim-load-ignores-hybrid-groups (fsdp_conformance/known/entries.py).
# Usage: python fsdp1_hsdp_dcp_load_chunks.py   (writes per-rank JSON under $TMPDIR/hsdpprobe/out)
"""Probe: FSDP1 HYBRID_SHARD + DCP load_sharded_optimizer_state_dict mis-sharding.
4 ranks (gloo, CPU) = 2 replicas x 2-rank shard groups {0,1},{2,3}; replicate {0,2},{1,3}."""
import json, math, os, shutil, socket, sys
from datetime import timedelta
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp



class NestedMLP(nn.Module):
    """fsdp-conformance's zoo 'mlp': inp=Linear(7,13), block=[Linear(13,11), Tanh, Linear(11,5)],
    head=Linear(5,2)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 13)
        self.block = nn.Sequential(nn.Linear(13, 11), nn.Tanh(), nn.Linear(11, 5))
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.inp(x))))

WS, S = 4, 2
CKPT = os.path.join(os.environ.get("TMPDIR", "/tmp"), "hsdpprobe", "ckpt")
OUT = os.path.join(os.environ.get("TMPDIR", "/tmp"), "hsdpprobe", "out")


def bits(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def beq(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def build(shard_g, repl_g):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import CustomPolicy
    torch.manual_seed(0)
    m = NestedMLP().to(torch.float64)
    targets = {id(m.inp), id(m.block), id(m.block[2])}
    f = FSDP(m, process_group=(shard_g, repl_g), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
             use_orig_params=False, device_id=torch.device("cpu"),
             auto_wrap_policy=CustomPolicy(lambda mod: id(mod) in targets))
    opt = torch.optim.AdamW(f.parameters(), lr=0.01)
    return f, opt


def flat_names(f):
    """optimizer index -> (flat param module name, [orig FQNs], [shapes])"""
    from torch.distributed.fsdp._optim_utils import _get_param_to_fqns
    p2f = _get_param_to_fqns(f)
    names = {id(p): n for n, p in f.named_parameters()}
    return [(names[id(p)], p2f[p], list(p._shapes)) for p in f.parameters()]


def predict_T_prime(T, g_ranks):
    """Hypothesis steps 1+2: chunk T over GLOBAL ws=4 along dim 0; the shard-group members
    g_ranks=[a,b] contribute chunk a and chunk b, each flattened and zero-padded to
    cs = ceil(R/2)*n//R, concatenated, narrowed to n, reshaped."""
    R, n = T.shape[0], T.numel()
    chunks = torch.chunk(T, WS, dim=0)
    cs = math.ceil(R / S) * n // R
    parts = []
    for g in g_ranks:
        loc = chunks[g].flatten() if g < len(chunks) else torch.zeros(0, dtype=T.dtype)
        parts.append(F.pad(loc, [0, cs - loc.numel()]) if cs > loc.numel() else loc)
    return torch.cat(parts).narrow(0, 0, n).reshape(T.shape)


def fsdp_shard(flat, i):
    """Step 3: shard of the flat tensor for index i in a group of S (pad the tail to equal size)."""
    s = math.ceil(flat.numel() / S)
    c = flat[i * s:(i + 1) * s]
    return F.pad(c, [0, s - c.numel()])


def worker(rank, port):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    import torch.distributed.checkpoint.optimizer as dcpo
    import torch.distributed._state_dict_utils as sdu
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WS, timeout=timedelta(seconds=60))
    shard_groups = [dist.new_group(list(range(i, i + S))) for i in range(0, WS, S)]
    repl_groups = [dist.new_group(list(range(j, WS, S))) for j in range(S)]
    shard_g, repl_g = shard_groups[rank // S], repl_groups[rank % S]
    g_ranks = list(range((rank // S) * S, (rank // S) * S + S))
    idx_in_group = rank % S
    res = {"rank": rank, "shard_group": g_ranks}

    f, opt = build(shard_g, repl_g)
    for step in range(2):
        torch.manual_seed(100 + 10 * step + rank)
        x = torch.randn(3, 7, dtype=torch.float64)
        opt.zero_grad()
        f(x).pow(2).sum().backward()
        opt.step()
    fn = flat_names(f)
    res["units"] = [(a, b, [list(s) for s in c]) for a, b, c in fn]
    st0 = f._fsdp_wrapped_module  # noqa
    res["fsdp_state_rank_ws"] = [f.rank, f.world_size, dist.get_process_group_ranks(f.process_group)]
    correct_local = {k: {s: v.clone() for s, v in d.items()} for k, d in opt.state_dict()["state"].items()}
    full = FSDP.full_optim_state_dict(f, opt, rank0_only=False)["state"]  # FQN-keyed unflattened T
    with FSDP.state_dict_type(f, StateDictType.SHARDED_STATE_DICT):
        osd = FSDP.optim_state_dict(f, opt)
        msd = f.state_dict()
    if rank == 0 and os.path.exists(CKPT):
        shutil.rmtree(CKPT)
    dist.barrier()
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=CKPT)
    dist.barrier()

    # ---- instrument the load path (records only; behaviour unchanged) ----
    rec_chunk, rec_gather = [], []
    orig_cc = dcpo._create_chunk_sharded_tensor

    def cc(tensor, rank, world_size, num_devices_per_node, pg, device=None):
        rec_chunk.append({"shape": list(tensor.shape), "rank": rank, "world_size": world_size,
                          "pg_ranks": dist.get_process_group_ranks(pg)})
        return orig_cc(tensor, rank, world_size, num_devices_per_node, pg, device)
    dcpo._create_chunk_sharded_tensor = cc
    orig_ag = sdu._all_gather_sharded_tensor

    def ag(st, pg=None, device=None):
        out = orig_ag(st, pg, device)
        R = st.size()[0]
        n = st.size().numel()
        w = dist.get_world_size(pg)
        rec_gather.append({"shape": list(st.size()), "pg_ranks": dist.get_process_group_ranks(pg),
                           "chunk_size": math.ceil(R / w) * n // R,
                           "local_shards": [(list(s.metadata.shard_offsets), list(s.metadata.shard_sizes))
                                            for s in st.local_shards()]})
        ag.outs.append(out.clone())
        return out
    ag.outs = []
    sdu._all_gather_sharded_tensor = ag

    f2, opt2 = build(shard_g, repl_g)
    with FSDP.state_dict_type(f2, StateDictType.SHARDED_STATE_DICT):
        msd2 = f2.state_dict()
    loaded = load_sharded_optimizer_state_dict(model_state_dict=msd2, optimizer_key="optim",
                                               storage_reader=FileSystemReader(CKPT))
    # Step 1 check: local shards of the loaded ShardedTensors == chunk(T, 4)[rank]
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    step1 = {}
    for fqn, d in loaded["optim"]["state"].items():
        for sname, v in d.items():
            if isinstance(v, ShardedTensor):
                T = full[fqn][sname]
                ch = torch.chunk(T, WS, 0)
                exp = ch[rank] if rank < len(ch) else None
                ls = v.local_shards()
                if exp is None:
                    ok = len(ls) == 0
                else:
                    ok = len(ls) == 1 and beq(ls[0].tensor, exp) and \
                        ls[0].metadata.shard_offsets[0] == math.ceil(T.shape[0] / WS) * rank
                step1[f"{fqn}.{sname}"] = {"ok": ok, "local": [(list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)) for s in ls]}
            else:
                step1[f"{fqn}.{sname}"] = {"type": type(v).__name__, "ok": beq(v, full[fqn][sname]) if torch.is_tensor(v) else None}
    res["step1"] = step1
    with FSDP.state_dict_type(f2, StateDictType.SHARDED_STATE_DICT):
        flat = FSDP.optim_state_dict_to_load(f2, opt2, loaded["optim"])
    opt2.load_state_dict(flat)
    dcpo._create_chunk_sharded_tensor = orig_cc
    sdu._all_gather_sharded_tensor = orig_ag
    res["rec_chunk"] = rec_chunk
    res["rec_gather"] = rec_gather

    # Step 2 check: each gathered T' == predicted T'
    # (gather order follows _flatten_optim_state: per flat param, per fqn, per state name)
    res["step2"] = []
    # Steps 1-3 end to end: compare loaded local flat state with prediction
    got = opt2.state_dict()["state"]
    units = {}
    for i, (uname, fqns, shapes) in enumerate(fn):
        u = {}
        for sname in ("exp_avg", "exp_avg_sq", "step"):
            g = got[i][sname]
            c = correct_local[i][sname]
            if sname == "step":
                u[sname] = {"pred_match": beq(g, full[fqns[0]]["step"]), "got": float(g), "correct": float(c)}
                continue
            Tps = [predict_T_prime(full[q][sname], g_ranks) for q in fqns]
            pred = fsdp_shard(torch.cat([t.flatten() for t in Tps]), idx_in_group)
            diff_correct = (bits(g) != bits(c)).nonzero().flatten().tolist()
            diff_pred = (bits(g) != bits(pred)).nonzero().flatten().tolist() if g.shape == pred.shape else "shape"
            u[sname] = {"pred_match_bitwise": g.shape == pred.shape and beq(g, pred),
                        "numel": g.numel(), "pred_diff_elems": diff_pred,
                        "elems_differing_from_correct": diff_correct,
                        "elems_zero_in_got_nonzero_in_correct": ((g == 0) & (c != 0)).nonzero().flatten().tolist()}
        units[uname] = u
    res["units_result"] = units
    # T' gathered vs predicted, in call order
    k = 0
    for i, (uname, fqns, shapes) in enumerate(fn):
        for q in fqns:
            snames = [s for s, v in loaded["optim"]["state"][q].items() if isinstance(v, ShardedTensor)]
            for sname in snames:  # same dict order as _gather_state_dict iterates
                out = ag.outs[k]
                res["step2"].append({"fqn": q, "state": sname,
                                     "match": beq(out, predict_T_prime(full[q][sname], g_ranks)),
                                     "equals_true_T": beq(out, full[q][sname])})
                k += 1
    res["n_gathers"] = len(ag.outs)
    with open(f"{OUT}/rank{rank}.json", "w") as fh:
        json.dump(res, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for p in os.listdir(OUT):
        os.remove(os.path.join(OUT, p))
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.start_processes(worker, args=(port,), nprocs=WS, join=False, start_method="spawn")
    import time
    t0 = time.time()
    while not ctx.join(timeout=5):
        if time.time() - t0 > 240:
            for p in ctx.processes:
                p.kill()
            sys.exit("timeout")
    print("torch", torch.__version__)
    for r in range(WS):
        d = json.load(open(f"{OUT}/rank{r}.json"))
        print(f"== rank {r} shard group {d['shard_group']} fsdp(rank,ws,pg)={d['fsdp_state_rank_ws']}")
        print("  step1 (loaded ST local shard == chunk(T,4)[rank]):",
              all(v["ok"] for v in d["step1"].values()))
        print("  step2 (gathered T' == predicted T'):", [(e["fqn"], e["state"], e["match"], e["equals_true_T"]) for e in d["step2"]])
        for u, v in d["units_result"].items():
            for sn, x in v.items():
                if sn == "step":
                    print(f"  {u:28s} step match={x['pred_match']} got={x['got']} correct={x['correct']}")
                else:
                    print(f"  {u:28s} {sn:10s} numel={x['numel']} PRED_BITWISE={x['pred_match_bitwise']} "
                          f"wrong_vs_correct={len(x['elems_differing_from_correct'])} zeroed={x['elems_zero_in_got_nonzero_in_correct']}")
