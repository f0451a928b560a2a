"""The property catalogue is the one source of P0-P16: the table in
docs/reference/properties.md, the plugin's names and the run's property set all come from it."""
from __future__ import annotations

from fsdp_conformance.properties.catalogue import CATALOGUE, PROPS, markdown_table
from fsdp_conformance.user.spec import PROPERTY_NAMES

from suites.conftest import ROOT


PAGE = ROOT / "docs" / "reference" / "properties.md"


def test_reference_property_table_is_the_catalogue():
    assert markdown_table() in PAGE.read_text(encoding="utf-8"), (
        "the property table of docs/reference/properties.md differs from "
        "properties/catalogue.py: replace it with the output of\n  python -c 'from "
        "fsdp_conformance.properties.catalogue import markdown_table; print(markdown_table())'")


def test_catalogue_covers_p0_to_p16_once_and_the_plugin_reads_it():
    assert PROPS == tuple(f"P{i}" for i in range(17))
    assert len({p.name for p in CATALOGUE}) == 17
    assert PROPERTY_NAMES == {p.id: p.name for p in CATALOGUE}


def test_every_property_names_a_module_that_decides_it():
    import importlib

    for p in CATALOGUE:
        for mod in p.module.split(", "):
            importlib.import_module(f"fsdp_conformance.properties.{mod}")
