"""Kept for the documented path ``fsdp_conformance.strategies``: the hypothesis strategies
live in ``fsdp_conformance.user.strategies``."""
from .user.strategies import (CI, NIGHTLY, WIDTHS, GeneratedNet, cases, fsdp_settings,
                              generated_batch, module_trees, profile_name, user_roundtrips,
                              world_size_pairs)

__all__ = ["CI", "NIGHTLY", "WIDTHS", "GeneratedNet", "cases", "fsdp_settings",
           "generated_batch", "module_trees", "profile_name", "user_roundtrips",
           "world_size_pairs"]
