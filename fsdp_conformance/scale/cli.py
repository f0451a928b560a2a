"""``fsdp-conformance scale``: check a model's ``fully_shard`` layout at the world sizes users
run (hundreds to thousands of ranks), on one machine (scale/check.py), and write the report
(JSON and Markdown, atomically).

Exit codes: 0 every sampled rank's pieces and plans are the reference's on both meshes and
whatever torch raised is a known limitation exactly as modelled; 1 otherwise; 2 usage error
(an unknown model, a malformed mesh).
"""
from __future__ import annotations

import argparse
import sys
import textwrap

from ..usage import add_out, beside

EXAMPLE = ("examples:\n  fsdp-conformance scale --model llama3-8b --save 1024 --load 768\n"
           "  fsdp-conformance scale --model llama3-70b --save 64x16 --load 48x16\n"
           "  fsdp-conformance scale --model mypkg.models:make_model --save 512 --load 384")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "scale", help="check a model's fully_shard layout at 1,024 ranks on one machine",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLE,
        description=textwrap.fill(
            "Simulate ranks of a job of up to thousands (torch's fake process group, the "
            "model on the meta device, fully_shard per decoder layer then the root) and "
            "check that every sampled rank's piece of every parameter (local shape, global "
            "offset as DCP computes it) is the reference implementation's, on the save mesh "
            "and on the load mesh; that each mesh's pieces hold every element exactly once; "
            "and that DCP's own plans agree by key and position: each sampled save rank "
            "writes every key once at its place, torch's coordinator over every rank's plan "
            "leaves each key written once and writes the reference's metadata, each sampled "
            "load rank reads every element of its new piece from the same element of the "
            "same saved key. What torch "
            "raises is a failure unless a known limitation models it exactly. Exit codes: 0 "
            "all equal, 1 a difference, 2 usage error.", 88))
    p.add_argument("--model", required=True,
                   help="a built-in model (llama3-8b, llama3-70b, moe) or a factory "
                        "'package.module:function' called under torch.device('meta')")
    p.add_argument("--save", required=True,
                   help="the save mesh: N, RxS (HSDP: R replicas x S shards) or DxTtp (FSDP "
                        "over D ranks x tensor parallelism T, the built-in models' "
                        "tensor-parallel plan), e.g. 1024, 64x16, 128x8tp")
    p.add_argument("--load", default=None, help="the load mesh (default: the save's)")
    add_out(p, old=("--json",), help="the JSON report (default "
                                     "reports/scale-<model>-<save>-<load>.json); the Markdown "
                                     "goes beside it")


def _model(text: str):
    from .models import SHAPES

    if text in SHAPES:
        return text
    if ":" not in text:
        raise ValueError(f"--model {text!r}: not a built-in model ({', '.join(sorted(SHAPES))})"
                         f" nor a factory 'package.module:function'")
    from ..user.refs import Ref

    return Ref.of(text, "--model").resolve()


def to_json(result) -> dict:
    """The report's JSON form (schema ``fsdp-conformance/scale/1``)."""
    from ..report.io import machine_info

    return {"schema": "fsdp-conformance/scale/1", "model": result.model,
            "params": result.params, "elements": result.elements, "ok": result.ok,
            "ranks_per_second": round(result.ranks_per_second, 3),
            "peak_rss_mib": round(result.peak_rss_mib, 1), "machine_info": machine_info(),
            "sides": {k: {"mesh": s.mesh, "ranks": list(s.ranks),
                          "mismatches": list(s.mismatches), "cover": list(s.cover),
                          "plans": list(s.plans), "raised": list(s.raised),
                          "sources": list(s.sources),
                          "empty_params": s.empty_params, "seconds": round(s.seconds, 2)}
                      for k, s in result.sides.items()},
            "unreached": dict(result.unreached),
            "known": [{"key": k.key, "params": list(k.params), "status": k.status,
                       "detail": k.detail, "workaround": k.workaround} for k in result.known]}


def _status(problems) -> str:
    return "FAIL" if problems else "PASS"


def to_markdown(doc: dict) -> str:
    """The report as Markdown: the verdict, the figures and the machine, then each side."""
    from ..report.run_report import machine_line

    out = [f"# fsdp-conformance scale: {doc['model']}", "",
           f"- {'OK' if doc['ok'] else 'FAILED'}: {doc['params']} parameters "
           f"({doc['elements']:,} elements)",
           f"- {doc['ranks_per_second']} ranks simulated per second; peak resident memory "
           f"{doc['peak_rss_mib']} MiB",
           f"- torch {(doc.get('machine_info') or {}).get('torch_version', '?')}; machine: "
           f"{machine_line(doc)}",
           f"- command: `{' '.join(doc.get('argv') or [])}`", ""]
    for name, why in (doc.get("unreached") or {}).items():
        out += [f"- not reached ({name}): {why}"]
    for k in doc.get("known") or []:
        out += [f"- {k['status'].upper()} {k['key']} ({', '.join(k['params'])}): "
                f"{k['detail']}; checked on without them: {k['workaround']}"]
    out += [""] if doc.get("unreached") or doc.get("known") else []
    for name, s in doc["sides"].items():
        raised = s.get("raised") or []  # a report of an older version: a raise ended it
        out += [f"## {name}: mesh {s['mesh']}", "",
                f"- ranks simulated ({len(s['ranks'])}, the sample: every class of piece): "
                f"{', '.join(map(str, s['ranks']))}",
                f"- parameters some rank holds none of: {s['empty_params']}",
                f"- {_status(s['cover'])} exact cover of the reference pieces: "
                f"{'yes' if not s['cover'] else '; '.join(s['cover'][:20])}",
                f"- {_status(s['mismatches'])} pieces that differ from the reference: "
                f"{len(s['mismatches'])}",
                f"- {_status(s['plans'])} DCP plans, by key and position: "
                f"{'as the reference' if not s['plans'] else str(len(s['plans'])) + ' problems'}",
                f"- {_status(raised)} torch raised: "
                f"{'nothing' if not raised else '; '.join(raised)}",
                f"- {s['seconds']} s", ""]
        sources = s.get("sources") or []  # a report of an older version: not said
        out += (["what each check compares, from torch or from the reference:", ""]
                + [f"- {line}" for line in sources] + [""]) if sources else []
        problems = s["mismatches"][:50] + s["plans"][:50]
        out += [f"  - {m}" for m in problems] + ([""] if problems else [])
    return "\n".join(out)


def main(args) -> int:
    from ..report.io import write_json_atomic, write_text_atomic
    from .check import check_scale

    try:
        model = _model(args.model)
        result = check_scale(model, args.save, args.load,
                             on_rank=lambda side, r: print(f"{side}: rank {r} done",
                                                           file=sys.stderr))
    except ValueError as exc:
        print(f"fsdp-conformance scale: error: {exc}", file=sys.stderr)
        return 2
    from ..run.cli import command_line

    doc = {**to_json(result), "argv": command_line()}
    slug = "-".join(x.replace(":", ".") for x in (args.model.rsplit(":", 1)[-1], args.save,
                                                    args.load or args.save))
    path = args.out or f"reports/scale-{slug}.json"
    write_json_atomic(path, doc)
    md = beside(path, ".md")
    write_text_atomic(md, to_markdown(doc))
    print(to_markdown(doc).split("\n## ")[0])
    print(f"report: {path}, {md}")
    return 0 if result.ok else 1
