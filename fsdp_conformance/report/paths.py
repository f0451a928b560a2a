"""How a report names files: so that a reader on another machine finds them.

Rules
- A file of an installed package (``.../site-packages/torch/optim/adam.py``, ``.../dist-
  packages/...``) is named from its package: ``torch/optim/adam.py``.
- A file of this package, installed or in a clone, is named from it:
  ``fsdp_conformance/sut/paths.py``.
- A file under the directory the run started in is named relative to it; the home directory
  is ``~``. Anything else is kept as it is (it says where it was).
- Only the text of the report changes: line numbers, messages and everything the models and
  digests read stay as they were (a digest never reads a file's directory).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_START = r"(?<![^\s\"'(=\[,])"
"""Where a path may start: the text's start, or after a space, a quote, ``(``, ``=``, ``[``
or ``,`` (not inside a word, a relative path or a URL)."""
_PACKAGES = re.compile(_START + r"/[^\s\"'():]*?/(?:site|dist)-packages/")
"""An absolute directory prefix ending in site-packages/ or dist-packages/, where a path
starts."""


def _prefixes() -> list[tuple[str, str]]:
    """(absolute prefix, what replaces it), longest first."""
    own = str(Path(__file__).resolve().parents[1])  # .../fsdp_conformance
    pairs = [(own + os.sep, "fsdp_conformance/")]
    cwd = os.getcwd()
    if cwd not in ("/", ""):
        pairs.append((cwd.rstrip(os.sep) + os.sep, ""))
    home = os.path.expanduser("~")
    if home not in ("/", "", "~"):
        pairs.append((home.rstrip(os.sep) + os.sep, "~/"))
    return sorted(pairs, key=lambda p: -len(p[0]))


def portable_text(text: str, prefixes: list[tuple[str, str]] | None = None) -> str:
    """``text`` with every absolute file path written as the module rules say."""
    if "/" not in text:
        return text
    text = _PACKAGES.sub("", text)
    for prefix, short in prefixes if prefixes is not None else _prefixes():
        if prefix in text:
            text = re.sub(_START + re.escape(prefix), lambda _: short, text)
    return text


def portable(obj: Any, prefixes: list[tuple[str, str]] | None = None) -> Any:
    """``obj`` (JSON-ready: dicts, lists, strings, numbers) with ``portable_text`` applied to
    every string in it, keys excepted."""
    prefixes = _prefixes() if prefixes is None else prefixes
    if isinstance(obj, str):
        return portable_text(obj, prefixes)
    if isinstance(obj, dict):
        return {k: portable(v, prefixes) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v, prefixes) for v in obj]
    return obj
