"""``fsdp-conformance run -k`` has pytest's meaning (run/keyword.py)."""
import pytest

from fsdp_conformance.run import matrix
from fsdp_conformance.run.keyword import compile_keyword

QUICK = matrix.quick(matrix.default_paths())


def _ids(expr: str) -> set[str]:
    return {c.id for c in matrix.select(QUICK, keyword=expr)}


def test_or_selects_the_union_where_the_old_reading_matched_orig():
    full1, full2 = _ids("fsdp1.full/"), _ids("fsdp2.full/")
    assert full1 and full2
    assert _ids("fsdp1.full/ or fsdp2.full/") == full1 | full2


def test_and_not_parentheses_and_side_by_side_words():
    sched = _ids("sched")
    fsdp1 = {i for i in sched if "fsdp1" in i}  # a golden id names its fixture's path too
    assert _ids("sched and not fsdp1") == sched - fsdp1
    assert _ids("sched not fsdp1") == sched - fsdp1  # side by side: and
    assert _ids("(sched or bounds) and fsdp2.full/") == {
        i for i in _ids("fsdp2.full/") if "sched" in i or "bounds" in i}


def test_words_hold_the_characters_of_case_ids_and_match_ignoring_case():
    one = next(iter(_ids("ws2->3")))
    assert compile_keyword(one)(one) and compile_keyword(one.upper())(one)
    assert compile_keyword("+sched:onecycle")("fsdp1.full/adamwx2g+sched:onecycle/mlp")


@pytest.mark.parametrize("bad", ["sched and", "(sched", "or fsdp1"])
def test_a_malformed_expression_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"-k .* is not a valid expression"):
        compile_keyword(bad)
