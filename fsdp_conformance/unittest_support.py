"""Kept for the documented path ``fsdp_conformance.unittest_support.FSDPTestCase``: the
unittest support lives in ``fsdp_conformance.user.unittest_support``."""
from .user.unittest_support import FSDPTestCase, conformance_cases, world_sizes

__all__ = ["FSDPTestCase", "conformance_cases", "world_sizes"]
