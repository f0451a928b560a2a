"""A verdict's detail as a person reads it first: the cause before its consequences, each
thing once, cut only between lines.

Rules (``readable``; the JSON report keeps the detail as the judge wrote it)
- A detail is blocks separated by blank lines. Everything from a block ``as observed:`` on
  is the raw observation a known limitation's residual quotes: kept after the rest, as is.
- Blocks that differ only in the rank they name (``rank 0: ...``, ``rank 1: ...``, the same
  text after it) are one block naming the ranks (``ranks 0, 1, 2: ...``).
- Blocks about the training state a resume restores (the LR scheduler, the learning rate,
  the step, the param groups) come before blocks of per-parameter differences, which a
  wrong learning rate or step causes; blocks that are information only (every line says
  "(information: ...)") come last; otherwise the judge's order stands.
- ``first_lines``: the first ``n`` lines and how many were left out: whole lines only.
"""
from __future__ import annotations

import re

_RANK = re.compile(r"^rank (\d+): ", re.M)
_CAUSES = re.compile(r"scheduler|\blr\b|learning rate|'lr'|'step'|the step\b|param_groups|"
                     r"param groups|resumed update", re.I)


def _merge_ranks(blocks: list[str]) -> list[str]:
    out: list[str] = []
    index: dict[str, int] = {}
    ranks: dict[str, list[str]] = {}
    for b in blocks:
        m = _RANK.match(b)
        if m is None or len(_RANK.findall(b)) != 1:
            out.append(b)
            continue
        rest = b[m.end():]
        if rest in index:
            ranks[rest].append(m.group(1))
            continue
        index[rest] = len(out)
        ranks[rest] = [m.group(1)]
        out.append(b)
    for rest, i in index.items():
        if len(ranks[rest]) > 1:
            out[i] = f"ranks {', '.join(ranks[rest])}: {rest}"
    return out


def _info_only(block: str) -> bool:
    lines = [ln for ln in block.splitlines() if ln.strip()]
    return bool(lines) and all("(information:" in ln for ln in lines)


def readable(detail: str) -> str:
    """``detail`` in reading order (module rules)."""
    text = detail.strip("\n")
    head, sep, observed = text.partition("\n\nas observed:\n")
    blocks = [b for b in head.split("\n\n") if b.strip()]
    if not blocks:
        return detail
    # a known limitation's residual: its header stays first
    lead = blocks[:1] if blocks[0].startswith("known limitation ") else []
    rest = _merge_ranks(blocks[len(lead):])
    info = [b for b in rest if _info_only(b)]
    causes = [b for b in rest if b not in info and _CAUSES.search(b.splitlines()[0])]
    others = [b for b in rest if b not in causes and b not in info]
    out = "\n\n".join(lead + causes + others + info)
    return out + (f"{sep}{observed}" if sep else "")


def first_lines(text: str, n: int) -> tuple[list[str], int]:
    """The first ``n`` whole lines of ``text`` and how many more there are."""
    lines = text.splitlines() or [""]
    return lines[:n], max(0, len(lines) - n)
