"""The catalogue of properties P0-P16: id, name, what each checks, which cases decide it and
why it can be n/a. The run, the report, the plugin and the properties reference page
(docs/reference/properties.md) read it from here.

Rule: every property is decided in ``fsdp_conformance.properties`` (``module`` names where);
a case that cannot check one reports it "n/a" with one of the reasons listed here, never a
pass. Imports nothing heavy (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Property:
    """One property of the conformance run."""

    id: str
    """``"P0"`` .. ``"P16"``."""
    name: str
    """Short name (``"layout"``, ``"gather"``...)."""
    checks: str
    """What it checks, in one sentence (the reference page's table text)."""
    decided_by: str
    """Which cases decide it: ``"round trip"``, ``"rekey path"``, ``"golden"``, ``"bounds"``,
    ``"fault"``, ``"crash"``."""
    module: str
    """The module under ``fsdp_conformance.properties`` that decides it."""
    na_reasons: tuple[str, ...] = ()
    """Why a case may report it n/a (besides "not this kind of case")."""
    verdict: str = "correctness"
    """Which verdict of the run it counts towards: ``"correctness"`` (what torch computes,
    machine-free) or ``"bounds"`` (time and memory: judged against a calibration and this
    machine's measured speed; ``fsdp-conformance run --bounds`` says whether it gates)."""


CATALOGUE: tuple[Property, ...] = (
    Property(id="P0", name="layout", decided_by="round trip", module="sharding",
             checks="FSDP's flat-param metadata (FSDP2: per-parameter DTensor placements) on "
                    "both pools == the reference layout (exact)"),
    Property(id="P1", name="gather", decided_by="round trip", module="saved",
             checks="what the path saved == reference.gather_full(every rank's local state) "
                    "(bitwise)"),
    Property(id="P2", name="vs one process", decided_by="round trip", module="run_props",
             checks="saved state ~= the single-process optimizer after the same steps (rtol "
                    "1e-9 in float64; step and param groups exact)",
             na_reasons=("the model has ignored modules: no single-process run can match",)),
    Property(id="P3", name="load", decided_by="round trip", module="loaded",
             checks="every rank's state after the load == reference.shard_full(saved); same "
                    "world size and plan: == its own state before saving (bitwise)"),
    Property(id="P4", name="flatten", decided_by="round trip", module="flatten",
             checks="sharded paths: reference.flatten_sharded(torch's sharded dict) == the "
                    "rank's flat state",
             na_reasons=("the path does not save a sharded dict",)),
    Property(id="P5", name="rekey", decided_by="rekey path", module="rekey_props",
             checks="rekey path: the PARAM_ID dict == reference, loads into the unwrapped "
                    "optimizer, rekeys back to the same names",
             na_reasons=("this path does not rekey",)),
    Property(id="P6", name="resume", decided_by="round trip", module="run_props",
             checks="params, losses and state after resuming at M ~= uninterrupted "
                    "single-process training (one loss per resumed step; step exact)",
             na_reasons=("the model has ignored modules: no single-process run can match",)),
    Property(id="P7", name="idempotent", decided_by="round trip", module="idempotent",
             checks="save -> load -> save gives bitwise the same dict"),
    Property(id="P8", name="serialise", decided_by="round trip", module="run_props",
             checks="torch.load(weights_only=True) / DCP read-back gives bitwise what was "
                    "saved (every rank's own file for per-rank paths)"),
    Property(id="P9", name="flags", decided_by="round trip", module="flags",
             checks="rank0_only: other ranks get {}, rank 0 equals the all-ranks dict; "
                    "offload_to_cpu: the same dict, all on CPU (where the ranks compute on "
                    "another device: on CPU that part cannot fail)",
             na_reasons=("the path has no rank0_only / offload flag that can be observed "
                         "here",)),
    Property(id="P10", name="partial state", decided_by="round trip", module="partial",
             checks="no step yet, stateless SGD, frozen or unused params, or any param "
                    "without state in the plain run: the same params have state as in the "
                    "plain run, before and after loading"),
    Property(id="P11", name="param groups", decided_by="round trip", module="groups",
             checks="every group's hyperparameters and extra keys (initial_lr) survive save "
                    "and load, exactly"),
    Property(id="P12", name="golden", decided_by="golden", module="golden_props",
             checks="a checkpoint stored by a torch version loads through every load path "
                    "that reads its format at world sizes 1-4 and gives the recorded state "
                    "bitwise; files are hash-checked first"),
    Property(id="P13", name="time", decided_by="bounds", module="bounds_props", verdict="bounds",
             checks="save and load work (CPU time) and wall time (slowest rank, min of 5) "
                    "each <= a x floor + c x speed, the floor and this machine's speed (probes) "
                    "timed in the same run; the work's growth "
                    "with world size within the calibrated exponent + 0.5"),
    Property(id="P14", name="memory", decided_by="bounds", module="bounds_props", verdict="bounds",
             checks="every rank's peak RSS during the call <= its bound (full state + one unit "
                    "where the rank holds the full dict, else shard + one unit) x the factor "
                    "calibrated for the path"),
    Property(id="P15", name="bad input", decided_by="fault", module="fault_props",
             checks="a missing or extra FQN, a wrong shape or dtype, mixed key types, another "
                    "model's checkpoint, a truncated or corrupted file make every rank raise an "
                    "error that names it; a silent load, a dead rank, stranded ranks or a hang "
                    "fail"),
    Property(id="P16", name="crash", decided_by="crash", module="crash_props",
             checks="a second save killed (SIGKILL, one rank or every rank) before it writes, "
                    "in async_save's staging, as it opens, inside or after its own data file, "
                    "or before DCP's metadata commit, into a new step folder or over the "
                    "first save: the load restores the newest save complete on disk exactly "
                    "(bitwise, as P3) or every rank that raises says the checkpoint is "
                    "incomplete; a silent mix (keys named by save), an unfinished save's "
                    "data, a hang or a dead rank fail",
             na_reasons=("the path's save has no such point (it completed without meeting "
                         "it)",)),
)
PROPS: tuple[str, ...] = tuple(p.id for p in CATALOGUE)
BY_ID = {p.id: p for p in CATALOGUE}
assert PROPS == tuple(f"P{i}" for i in range(17)), PROPS
BOUNDS_PROPS: tuple[str, ...] = tuple(p.id for p in CATALOGUE if p.verdict == "bounds")
"""The properties of the bounds verdict (P13, P14); every other one is correctness."""

# n/a reasons of properties that only cases of another kind decide
ONLY_GOLDEN = "not a golden-fixture case (P12 has its own cases: .../golden:<torch version>/<fixture>)"
ONLY_BOUNDS = {
    "P13": "not a bounds case (P13 is checked by the bounds cases: .../bounds)",
    "P14": "not a bounds case (P14 is checked by the bounds cases: .../bounds)",
}
ONLY_FAULT = "not a bad-input case (P15 has its own cases: .../fault:<kind>)"
ONLY_CRASH = "not a crash case (P16 has its own cases: .../crash:<point>.<who>.<layout>)"
NO_REKEY = "this path does not rekey"


def markdown_table() -> str:
    """The property table of docs/reference/properties.md, one row per property (a test
    keeps the page equal to it): id and name, what it checks, which cases decide it."""
    rows = ["| property | checks | decided by |", "|---|---|---|"]
    rows += [f"| {p.id} {p.name} | {p.checks} | {p.decided_by} cases |" for p in CATALOGUE]
    return "\n".join(rows)
