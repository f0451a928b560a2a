"""Properties P0..P16 as functions of (case, observations) -> Verdict."""
from .verdict import STATUSES, Verdict, error, fail, na, passed

__all__ = ["STATUSES", "Verdict", "error", "fail", "na", "passed"]
