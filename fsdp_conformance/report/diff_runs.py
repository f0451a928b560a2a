"""Comparing two run reports (schema ``fsdp-conformance/run/1``): verdicts per (case,
property), timings and peaks per (case, phase) by report/diff_measure.py's rules, and the
world-size scaling fits.

Verdicts (run reports), per (case id, property), BASE status -> NEW status:

================================  ==================  ===========
transition                        label               regression?
================================  ==================  ===========
pass / known / n/a -> fail/error  newly failing       yes
pass -> known                     newly known         yes
known(key A) -> known(key B)      newly known         yes
known -> known, another digest    known changed       yes
pass -> n/a                       no longer checked   yes
case or property only in BASE     missing in NEW      yes (of NEW's slice)
fail / error -> pass              newly passing       no
known -> pass                     known fixed         no
n/a -> pass / known               newly checked       no
fail <-> error, fail/error ->     changed             no
known / n/a, known -> n/a
case or property only in NEW      added in NEW        no
                                  (a property BASE's run never had, n/a in NEW: one note)
any other -> removed              API removed         no (its own
                                                      category)
removed -> any other              API restored        no
================================  ==================  ===========

A NEW run of part of its tier (``slice_of``: ``--case`` ids, ``-k``, fewer world sizes,
``--bounds off``) is compared with the cases of BASE the same selection picks; BASE's other
cases are outside the slice (one note says how many), not "missing in NEW". A case of the
slice that NEW lacks is still missing.

"removed" (run/removal.py) means NEW's torch no longer has the path's API: one change per
verdict is kept for the record, but the comparison reports it per path ("API removed: 4
paths"), and a gate blocks on it unless told to accept it (diff_model.py).

A newly known limitation is a regression: "known" means torch fails there and the suite
recognises the failure; for an upgrade gate a torch that starts failing a case the current
torch passes is a new torch failure whether or not it has an entry in ``known/entries.py``. Likewise
a check that stops being made (pass -> n/a, a case missing) can no longer vouch for the
candidate, so it cannot pass the gate silently. A failure in BASE that changes shape in NEW
was never a guarantee and is listed for information only. A known pair whose observation
changed (its ``digest``: another wrong value, another error) is a regression too: the
entry's model explains one effect, and a new torch that fails there differently fails
differently (pairs without a digest, from older reports, are compared by key only).

Machines: correctness verdicts are machine-free and compared the same way whatever the
machines. What is measured is not. Two reports' measurements are comparable
(``comparable``) when their machine fingerprints (``machine_info.fingerprint``, report/io.py:
CPU model, cores, architecture, OS, Python) are equal AND the machines ran the speed probes
(bounds/probe.py, measured beside every bounds case) at the same speed: each probe's
median CPU time within ``SAME_SPEED`` (1.3x) of the other's. The second test is needed
because a fingerprint cannot tell two virtual machines apart whose CPUs report one model
name ("AMD EPYC") and run Python 2.5-4x apart. Where they are not comparable, timings and
peaks are not compared (a note says how many pairs were skipped and why), scaling changes
are information only, and a P13/P14 verdict change is "bounds changed" (information: each
report's bounds were judged on its own machine at its own measured speed, and its own
report says whether they held there). Where they are comparable, all of these are compared
as below.

Scaling (run reports' top-level ``scaling``, per path/phase): a status that goes from pass to
fail is a regression, and so is an excess exponent (time's minus its floor's) that grew by
more than ``MIN_SCALING_EXPONENT_DELTA`` and by enough that over the measured world sizes it
multiplies the time at the largest one by more than ``max_slowdown``
(``(ws_max / ws_min) ** delta > max_slowdown``). Except where both entries carry a
calibrated allowance of the bounds (bounds/rules.py: ``allowed_exponent`` of the work, or
the ``allowed_excess`` of reports written before the work clock): the calibration measured
how far the exponent moves between identical runs, so there the
status (pass -> fail: beyond the calibrated worst + 0.5) decides and a move within it is
"scaling changed", information. (Two gate runs of the same code flagged +0.4 moves as
regressions before this rule.)
"""
from __future__ import annotations

from collections import Counter

from ..properties.verdict import STATUSES
from .diff_measure import (MIN_SCALING_EXPONENT_DELTA, clock_of, compare_peaks, compare_timing,
                           mib_text,
                           min_memory_delta, peaks_of, timing_of_measurement)
from .diff_model import Change, Comparison, Thresholds, facts_notes, sorted_changes
from .diff_read import run_facts
from ..properties.catalogue import BOUNDS_PROPS
from .run_report import FAILING, prop_key


def classify_status(base: dict, new: dict) -> str | None:
    """The label of one property's verdict change (module docstring's table), or None when
    nothing changed. ``base``/``new`` are verdict JSON objects ({"status", "known"?})."""
    b, n = base["status"], new["status"]
    if b == n == "known" and base.get("known") == new.get("known"):
        same = not (base.get("digest") and new.get("digest")) or base["digest"] == new["digest"]
        return None if same else "known changed"
    if b == n and b != "known":
        return None
    if n == "removed":
        return "API removed"
    if b == "removed":
        return "API restored"
    if n in FAILING:
        return "changed" if b in FAILING else "newly failing"
    if b in FAILING:
        return "newly passing" if n == "pass" else "changed"
    if b == "known":
        return {"pass": "known fixed", "known": "newly known"}.get(n, "changed")
    if b == "pass":
        return "newly known" if n == "known" else "no longer checked"
    return "newly checked"  # n/a -> pass / known


def _status_text(v: dict) -> str:
    return f"known ({v['known']})" if v["status"] == "known" and v.get("known") else v["status"]


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def observed_difference(base: str, new: str, limit: int = 240) -> str:
    """What two "known" verdicts of one entry observed differently: the first line where
    their observations (the detail after the entry's own text, which is the same on both
    sides) differ, printed floats blanked as the digest blanks them, as
    ``BASE: ... | NEW: ...``."""
    from ..known.model import mask_floats

    def observed(detail: str) -> list[str]:
        body = detail.split("\n\n", 1)[1] if "\n\n" in detail else detail
        return [ln.strip() for ln in body.splitlines() if ln.strip()]

    b, n = observed(base), observed(new)
    for i in range(max(len(b), len(n))):
        bl, nl = (b[i] if i < len(b) else "(nothing)"), (n[i] if i < len(n) else "(nothing)")
        if mask_floats(bl) != mask_floats(nl):
            cut = lambda t: t if len(t) <= limit else t[:limit - 3] + "..."  # noqa: E731
            return f"BASE: {cut(bl)} | NEW: {cut(nl)}"
    return "the observations differ only where the digest reads them (same lines)"


SAME_SPEED = 1.3


def probe_medians(report: dict) -> dict[str, float]:
    """Each speed probe's median CPU time over a run report's measurements ({} when it has
    none: reports written before the probes)."""
    import statistics

    seen: dict[str, list[float]] = {}
    for c in report.get("cases") or []:
        for m in (c.get("measurements") or {}).values():
            for k, v in ((m or {}).get("probe_cpu_s") or {}).items():
                seen.setdefault(k, []).append(float(v))
    return {k: statistics.median(v) for k, v in sorted(seen.items())}


def comparable(base: dict, new: dict) -> tuple[bool, str]:
    """(whether the two reports' measurements are comparable, why not) (module rules)."""
    fb = (base.get("machine_info") or {}).get("fingerprint")
    fn = (new.get("machine_info") or {}).get("fingerprint")
    if not (fb and fn and fb == fn):
        return False, f"machines differ (fingerprint {fb or 'none recorded'} -> {fn or 'none recorded'})"
    pb, pn = probe_medians(base), probe_medians(new)
    if not (pb or pn):
        return True, ""
    if set(pb) != set(pn):
        return False, ("one report has no speed probes (written before them, or a run "
                       "without bounds cases)")
    ratios = {k: pn[k] / pb[k] for k in pb if pb[k] > 0}
    off = {k: r for k, r in ratios.items() if not 1 / SAME_SPEED <= r <= SAME_SPEED}
    if off:
        return False, ("same fingerprint, another speed: the probes ran at "
                       + ", ".join(f"{k} x{r:.2f}" for k, r in off.items()) + " of BASE's")
    return True, ""


def slice_of(report: dict):
    """``(in_slice(case dict) -> bool, what the slice is in words)`` of a report whose run
    selected part of its tier: its ``--case`` ids or its part's planned ids (``run
    --shard``: ``selected_ids``), its ``-k`` expression
    (``selection``, read as ``run -k`` reads it), its world sizes, and ``--bounds off`` (no
    bounds case); ``(None, "")`` for a run of the whole tier. A case of another report is
    in the slice when the same selection would have chosen it."""
    from ..api_paths import PATH_NAMES
    from ..selection import compile_keyword

    ids = set(report.get("selected_ids") or ())
    expr = report.get("selection")
    sizes = set(report.get("world_sizes") or ())
    no_bounds = report.get("bounds_mode") == "off"
    said = []
    part = report.get("shard")
    if part:
        said.append(f"part {part['index']}/{part['count']} ({len(ids)} cases)")
    elif ids:
        said.append(f"--case ({len(ids)} id{'s' if len(ids) != 1 else ''})")
    if expr:
        said.append(f"-k {expr!r}")
    said.append(f"world sizes {sorted(sizes)}" if sizes else "")
    said.append("--bounds off" if no_bounds else "")
    match = compile_keyword(expr, PATH_NAMES) if expr else None

    def in_slice(c: dict) -> bool:
        if ids and c["id"] not in ids:
            return False
        if match is not None and not match(c["id"]):
            return False
        if no_bounds and c.get("bounds"):
            return False
        ws = {c.get("world_size"), c.get("load_world_size") or c.get("world_size")} - {None}
        return not sizes or ws <= sizes
    if not (ids or expr or no_bounds or sizes):
        return None, ""
    return in_slice, ", ".join(w for w in said if w)


def new_properties(base: dict, new: dict) -> dict[str, int]:
    """The properties no case of BASE has (added to the catalogue since BASE ran), with how
    many of NEW's cases that BASE has too report each n/a: those verdicts are one note, not
    a change per case (``_verdict_changes`` leaves them out)."""
    had = {p for c in base["cases"] for p in c["properties"]}
    bids = {c["id"] for c in base["cases"]}
    out: dict[str, int] = {}
    for c in new["cases"]:
        for p, v in c["properties"].items():
            if p not in had and c["id"] in bids and v["status"] == "n/a":
                out[p] = out.get(p, 0) + 1
    return out


def _verdict_changes(base: dict, new: dict, same: bool = True, in_slice=None,
                     unseen: frozenset = frozenset()) -> list[Change]:
    """The (case, property) changes; ``in_slice``: NEW's selection (``slice_of``), BASE's
    cases outside it left out; a property of ``unseen`` (``new_properties``: BASE's run
    never had it) that NEW reports n/a is no change."""
    out: list[Change] = []
    bcases = {c["id"]: c for c in base["cases"] if in_slice is None or in_slice(c)}
    ncases = {c["id"]: c for c in new["cases"]}
    for cid in sorted(bcases.keys() | ncases.keys()):
        if cid not in ncases:
            st = Counter(v["status"] for v in bcases[cid]["properties"].values())
            out.append(Change("missing in NEW", cid, "", "present", "absent",
                              f"{sum(st.values())} verdicts in BASE ("
                              + ", ".join(f"{st[s]} {s}" for s in STATUSES if st[s])
                              + ") not checked by NEW"))
            continue
        if cid not in bcases:
            out.append(Change("added in NEW", cid, "", "absent", "present"))
            continue
        bp, np_ = bcases[cid]["properties"], ncases[cid]["properties"]
        for prop in sorted(bp.keys() | np_.keys(), key=prop_key):
            if prop not in np_:
                out.append(Change("missing in NEW", cid, prop, _status_text(bp[prop]), "absent"))
            elif prop not in bp:
                if prop in unseen and np_[prop]["status"] == "n/a":
                    continue  # a property added since BASE ran, not checked here: one note
                out.append(Change("added in NEW", cid, prop, "absent", _status_text(np_[prop])))
            else:
                label = classify_status(bp[prop], np_[prop])
                if label and not same and prop in BOUNDS_PROPS:
                    label = "bounds changed"
                if label == "known changed":  # the entry's text is the same: show what differs
                    out.append(Change(label, cid, prop, _status_text(bp[prop]),
                                      _status_text(np_[prop]),
                                      observed_difference(bp[prop].get("detail", ""),
                                                          np_[prop].get("detail", ""))))
                elif label:
                    detail = np_[prop].get("detail", "") if np_[prop]["status"] != "pass" else ""
                    out.append(Change(label, cid, prop, _status_text(bp[prop]),
                                      _status_text(np_[prop]), _first_line(detail)))
    return out


def _measurement_changes(base: dict, new: dict, th: Thresholds,
                         bpath: str, npath: str) -> tuple[list[Change], list[str]]:
    out: list[Change] = []
    bcases = {c["id"]: c for c in base["cases"]}
    compared, one_sided = 0, 0
    for c in new["cases"]:
        cid = c["id"]
        bm = (bcases.get(cid) or {}).get("measurements") or {}
        nm = c.get("measurements") or {}
        if cid in bcases and bool(bm) != bool(nm):
            one_sided += 1
        for phase in sorted(bm.keys() & nm.keys()):
            compared += 1
            t = compare_timing(timing_of_measurement(bm[phase]), timing_of_measurement(nm[phase]),
                               th.max_slowdown)
            if t:
                clock = clock_of(nm[phase])
                key = "cpu_s" if clock == "work" else "time_s"
                out.append(Change(t[0], cid, f"{phase} {'work' if clock == 'work' else 'time'}",
                                  f"{bm[phase][key]:.6g} s", f"{nm[phase][key]:.6g} s", t[1]))
            bp = peaks_of(bm[phase], f"{bpath}: case {cid!r}: measurements.{phase}")
            np_ = peaks_of(nm[phase], f"{npath}: case {cid!r}: measurements.{phase}")
            if bp is not None and np_ is not None:
                for label, detail in compare_peaks(bp, np_, th.max_memory_growth,
                                                   min_memory_delta(nm[phase])):
                    out.append(Change(label, cid, f"{phase} memory", mib_text(max(bp, default=0)),
                                      mib_text(max(np_, default=0)), detail))
    notes = [f"timings and peaks compared for {compared} (case, phase) pair(s)"]
    if one_sided:
        notes.append(f"{one_sided} case(s) have measurements in only one report (not compared)")
    return out, notes


def _skipped_measurements(new: dict, why: str) -> str:
    """The note of a comparison whose measurements are not comparable (module rules)."""
    n = sum(len(c.get("measurements") or {}) for c in new["cases"])
    return (f"{why}: {n} timing and peak (case, phase) pair(s) not compared; scaling changes "
            f"and P13/P14 verdict changes are information only; correctness verdicts "
            f"compared as usual")


def _excess_exponent(s: dict) -> float:
    fe = s.get("floor_exponent")
    return float(s["exponent"]) - (float(fe) if isinstance(fe, (int, float)) else 0.0)


def _scaling_changes(base: dict, new: dict, th: Thresholds, same: bool = True,
                     in_slice=None) -> list[Change]:
    """The scaling fits' changes; ``in_slice``: NEW's selection where BASE has cases
    outside it (a path's fit is of the slice when a bounds case of that path is)."""
    out: list[Change] = []
    bs, ns = base.get("scaling") or {}, new.get("scaling") or {}
    if in_slice is not None:
        paths = {c.get("api") for c in base["cases"] if c.get("bounds") and in_slice(c)}
        bs = {k: v for k, v in bs.items() if k.split("/", 1)[0] in paths}
    for key in sorted(bs.keys() | ns.keys()):
        if key not in ns:
            out.append(Change("missing in NEW", key, "scaling", bs[key].get("status", "?"),
                              "absent"))
            continue
        if key not in bs:
            out.append(Change("added in NEW", key, "scaling", "absent", ns[key].get("status", "?")))
            continue
        b, n = bs[key], ns[key]
        db, dn = _excess_exponent(b), _excess_exponent(n)
        ws = [w for w in n.get("world_sizes") or b.get("world_sizes") or [] if w and w > 0]
        span = max(ws) / min(ws) if ws else 1.0
        delta = dn - db
        detail = (f"exponent {b['exponent']:.2f} -> {n['exponent']:.2f}, excess over the floor "
                  f"{db:+.2f} -> {dn:+.2f} over world sizes {ws}")
        if b.get("status") == "pass" and n.get("status") == "fail":
            out.append(Change("scaling worse" if same else "scaling changed", key, "scaling",
                              "pass", "fail",
                              f"{detail}; {_first_line(n.get('detail', ''))}"))
        elif abs(delta) > MIN_SCALING_EXPONENT_DELTA and span ** abs(delta) > th.max_slowdown:
            calibrated = all("allowed_exponent" in x or "allowed_excess" in x for x in (b, n))
            label = ("scaling changed" if calibrated or not same
                     else "scaling worse" if delta > 0 else "scaling better")
            out.append(Change(label, key, "scaling", f"{db:+.2f}", f"{dn:+.2f}",
                              f"{detail}: x{span ** delta:.2f} at the largest world size "
                              f"(threshold x{th.max_slowdown:g})"))
        elif b.get("status") == "fail" and n.get("status") == "pass":
            out.append(Change("scaling better", key, "scaling", "fail", "pass", detail))
    return out


def compare_runs(base: dict, new: dict, th: Thresholds = Thresholds(), *,
                 base_path: str = "BASE", new_path: str = "NEW") -> Comparison:
    """Compare two run reports (module docstring's rules)."""
    same, why = comparable(base, new)
    in_slice, what = slice_of(new)
    outside = 0 if in_slice is None else sum(1 for c in base["cases"] if not in_slice(c))
    added = new_properties(base, new)
    changes = _verdict_changes(base, new, same, in_slice, frozenset(added))
    if same:
        mchanges, notes = _measurement_changes(base, new, th, base_path, new_path)
    else:
        mchanges, notes = [], [_skipped_measurements(new, why)]
    changes += mchanges + _scaling_changes(base, new, th, same, in_slice if outside else None)
    bf, nf = run_facts(base), run_facts(new)
    notes = facts_notes(bf, nf, ("torch", "backend", "tier", "fingerprint")) + notes
    for prop, n in sorted(added.items(), key=lambda kv: prop_key(kv[0])):
        notes.append(f"{prop} is not in BASE's run (added since): n/a in {n} case(s) both "
                     f"runs have, not listed")
    if outside:
        notes.insert(0, f"NEW is a slice ({what}): {outside} of BASE's {len(base['cases'])} "
                        f"cases are outside it and not compared; the rest are compared as "
                        f"usual (a case of the slice missing in NEW is a regression)")
    return Comparison("run", base_path, new_path, bf, nf, th, sorted_changes(changes), tuple(notes))
