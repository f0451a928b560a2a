"""``fsdp-conformance run -k`` has pytest's meaning (selection.py)."""
import pytest

from fsdp_conformance.run import matrix
from fsdp_conformance.selection import compile_keyword

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


def test_a_paths_name_selects_that_paths_cases_only():
    """fsdp1 cases that load a golden fixture fsdp2.sharded wrote hold 'fsdp2.sharded' in
    their ids; the path's name selects fsdp2.sharded's own cases, the fixture's prefix the
    others."""
    own = _ids("fsdp2.sharded")
    assert own and all(i.startswith("fsdp2.sharded/") for i in own)
    loads = _ids("golden:2.13.0/fsdp2.sharded")
    assert any(not i.startswith("fsdp2.sharded/") for i in loads)


def test_case_selects_exact_ids_and_names_the_closest_for_a_typo():
    every = _ids("fsdp2.sharded")
    one = next(i for i in sorted(every) if sum(j.startswith(i) for j in every) > 1)
    assert [c.id for c in matrix.select(QUICK, ids=[one])] == [one]
    assert len(_ids(one)) > 1  # -k with an id is a substring: the longer ids too
    with pytest.raises(ValueError, match=r"no case has the id .*; did you mean '"):
        matrix.select(QUICK, ids=[one[:-1]])


def test_a_selection_of_nothing_says_why_in_words():
    text = matrix.no_match(QUICK, "quick", world_sizes=[64], keyword=None)
    assert "None" not in text and "the tier's cases use world sizes [1, 2, 3, 4]" in text
    text = matrix.no_match(QUICK, "quick", world_sizes=[1, 2], keyword="fsdp2.shardd or adam")
    assert "no case id contains 'fsdp2.shardd': did you mean 'fsdp2.sharded'" in text, text
