"""How a verdict that a user's declared limitation turned "known" reads (user/limitations.py
``apply_declared`` writes it; the reports and the plugin's summary read the user's reason
back from it): written once, here, beside the suite's own known limitations."""
from __future__ import annotations

DECLARED = "declared known limitation "
"""How a declared limitation's verdict begins: ``<DECLARED>'<key>': <the user's reason>``."""


def declared_reason(detail: str, key: str) -> str:
    """The user's reason in the detail of a verdict a declared limitation ``key`` turned
    "known", or "" when it is not such a verdict."""
    head = detail.split("\n", 1)[0]
    prefix = f"{DECLARED}{key!r}: "
    return head[len(prefix):] if head.startswith(prefix) else ""
