"""Kept for the documented path ``fsdp_conformance.roundtrip.check`` (and the names older
reproducer scripts import): the library lives in ``fsdp_conformance.user``."""
from .user.driver import check, reproduce, run_checked
from .user.failures import RoundtripFailure, failing
from .user.limitations import Limitation
from .user.model import CustomPath, UserModel, user_model
from .user.refs import Ref
from .user.run import run_user_case

__all__ = ["CustomPath", "Limitation", "Ref", "RoundtripFailure", "UserModel", "check",
           "failing", "reproduce", "run_checked", "run_user_case", "user_model"]
