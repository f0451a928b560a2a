"""``fsdp-conformance reshard``: convert a saved optimizer checkpoint offline (CPU, no
process group). Exit codes: 0 written, 1 the checkpoint does not fit the layout, 2 usage
error (bad arguments, unreadable input, refused output)."""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    """``reshard``: convert a saved optimizer checkpoint (reshard/conversion.py)."""
    r = sub.add_parser(
        "reshard", help="convert a saved optimizer checkpoint to another world size / wrapping",
        description="Offline (CPU, no process group) conversion of optimizer state. INPUT is a "
                    "torch.save'd full FQN-keyed dict (a file), a DCP checkpoint (a directory "
                    "with .metadata) or a directory of per-rank files (--pattern). Writes a NEW "
                    "directory of per-rank files (or a full dict file with --out-format full); "
                    "never writes over an existing path. Exit codes: 0 ok, 1 the checkpoint does "
                    "not fit the layout, 2 usage error (bad arguments, unreadable input, refused "
                    "output).")
    r.add_argument("input", help="full-dict file, DCP directory, or directory of per-rank files")
    r.add_argument("--out", required=True, help="output directory (or file with --out-format "
                                                "full); must not exist")
    r.add_argument("--model", required=True,
                   help="zoo model name, or module:callable (a factory returning the unwrapped "
                        "nn.Module)")
    r.add_argument("--plan", default="root",
                   help="source wrapping: a zoo plan name or comma-separated FQNs of submodules "
                        "that are their own FSDP unit (default: root only)")
    r.add_argument("--dst-plan", default=None, help="destination wrapping (default: --plan)")
    r.add_argument("--ignored", default=None,
                   help="comma-separated FQNs of ignored modules (default: the zoo model's)")
    r.add_argument("--src-world-size", type=int, default=None,
                   help="source world size (per-rank input; default: count the files)")
    r.add_argument("--dst-world-size", type=int, required=True, help="destination world size")
    r.add_argument("--use-orig-params", action="store_true", help="source use_orig_params=True")
    r.add_argument("--dst-use-orig-params", choices=["same", "true", "false"], default="same",
                   help="destination use_orig_params (default: same as the source)")
    strategies = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
    r.add_argument("--strategy", default="FULL_SHARD", choices=strategies,
                   help="source sharding strategy")
    r.add_argument("--dst-strategy", default=None, choices=strategies,
                   help="destination sharding strategy (default: --strategy)")
    r.add_argument("--shard-world-size", type=int, default=None,
                   help="HYBRID_SHARD shard group size, source")
    r.add_argument("--dst-shard-world-size", type=int, default=None,
                   help="HYBRID_SHARD shard group size, destination")
    r.add_argument("--dtype", default="auto", choices=["auto", "fp32", "fp64", "bf16", "fp16"],
                   help="dtype that sets FSDP's alignment with use_orig_params (param dtype or "
                        "MixedPrecision.param_dtype; auto: the checkpoint's state dtype)")
    r.add_argument("--input-kind", default="auto", choices=["auto", "full", "ranks", "dcp"])
    r.add_argument("--pattern", default="optim_rank{rank}.pt",
                   help="per-rank file names, input and output (default optim_rank{rank}.pt)")
    r.add_argument("--dcp-key", default=None,
                   help="top-level key holding the optimizer dict in a DCP checkpoint "
                        "(default: the only one found)")
    r.add_argument("--out-format", default="ranks", choices=["ranks", "full"])
    r.add_argument("--keys", default="auto", choices=["auto", "ids", "names"],
                   help="per-rank output keys: int ids (optim.load_state_dict) or names "
                        "(default: like the per-rank input; ids for a full/DCP input)")


def main(args) -> int:
    from . import DTYPES, LayoutSpec, convert
    from ..usage import NamedError

    def fqns(s):
        return None if s is None else tuple(x.strip() for x in s.split(",") if x.strip())

    dtype = None if args.dtype == "auto" else DTYPES[args.dtype]
    dst_uop = args.use_orig_params if args.dst_use_orig_params == "same" else (
        args.dst_use_orig_params == "true")
    src = LayoutSpec(args.model, args.plan, args.src_world_size or 0, args.use_orig_params,
                     args.strategy, args.shard_world_size, fqns(args.ignored), dtype)
    dst = LayoutSpec(args.model, args.dst_plan if args.dst_plan is not None else args.plan,
                     args.dst_world_size, dst_uop, args.dst_strategy or args.strategy,
                     args.dst_shard_world_size, fqns(args.ignored), dtype)
    try:
        res = convert(args.input, args.out, dst, src=src, kind=args.input_kind,
                      pattern=args.pattern, out_format=args.out_format, keys=args.keys,
                      dcp_key=args.dcp_key)
    except NamedError as e:
        print(f"fsdp-conformance reshard: error: {e}", file=sys.stderr)
        return e.exit_code
    print(res.summary())
    return 0
