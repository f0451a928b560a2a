"""check()'s options record (user/check_options.py): the same call as keyword arguments,
documented field by field, and bad input named before any rank starts."""
from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from fsdp_conformance import CheckOptions, check
from fsdp_conformance.user import check_options


def test_every_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(check_options))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CheckOptions")
    documented = set()
    body = cls.body
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            documented.add(a.target.id)
    names = {f.name for f in dataclasses.fields(CheckOptions)}
    assert names and names == documented, sorted(names - documented)


def test_keywords_and_the_record_are_one_call():
    o = CheckOptions(plan=["encoder"], world_sizes=["2->3"], steps=3)
    assert CheckOptions.of(plan=["encoder"], world_sizes=["2->3"], steps=3) == o
    assert CheckOptions.of(o) == o
    # keyword arguments beside options= replace its fields
    assert CheckOptions.of(o, steps=5) == dataclasses.replace(o, steps=5)


def test_an_unknown_option_is_named_with_the_ones_there_are():
    with pytest.raises(TypeError) as e:
        check("m:f", "m:g", world_size=["2"])  # a typo of world_sizes
    assert "['world_size']" in str(e.value) and "world_sizes" in str(e.value)


@pytest.mark.parametrize("given, says", [
    (dict(save_fn="m:save"), "pass both save_fn and load_fn"),
    (dict(shard_fn="m:shard", fsdp_version=1), "needs fsdp_version=2"),
    (dict(use_orig_params=True), "use_orig_params= is an option of FSDP1"),
])
def test_inconsistent_options_raise_before_any_rank(given, says):
    with pytest.raises((TypeError, ValueError), match=says):
        check("m:f", "m:g", **given)
    with pytest.raises((TypeError, ValueError), match=says):
        check("m:f", "m:g", options=CheckOptions.of(**{k: v for k, v in given.items()
                                                        if k == "fsdp_version"}), **given)
