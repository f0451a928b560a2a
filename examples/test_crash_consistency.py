"""Crash consistency (P16) of a trainer's own save under the plugin (``crash_consistency.py``):
``crash=`` (or ``--fsdp-crash``) adds cases that kill the save (SIGKILL, one rank or every
rank) at a point and then run the trainer's own load.

- The "latest folder" trainer fails where the kill falls after DCP's plan exchange and
  before it committed ``.metadata``: the load reads the unfinished save through the
  previous save's metadata, silently: whole where every rank wrote its data, mixed with
  the previous save where one rank had not. Killed before anything is written, or inside a
  data file, its load restores the previous save or raises: those pass.
- The step-folder trainer, which renames a finished folder into place, passes at every
  point: the load restores the previous checkpoint exactly.
"""
import pytest

from examples.crash_consistency import (data, latest_load, latest_save, make_model, step_load,
                                        step_save)

KILLS = ("start.rank0.over", "before_file.rank1.over", "torn.rank0.over",
         "own_file.rank1.over", "own_file.all.over", "commit.rank0.over")


def _p16(results) -> dict:
    return {r.case.crash: r.properties["P16"] for r in results if r.case.crash}


def test_latest_folder_loads_the_unfinished_save(fsdp_roundtrip):
    with pytest.raises(pytest.fail.Exception) as failure:  # the fixture fails the test
        fsdp_roundtrip(make_model, data, fsdp_version=2, plan=["0"], save_fn=latest_save,
                       load_fn=latest_load, world_sizes=["2"], crash=KILLS, links=1)
    p16 = _p16(fsdp_roundtrip.results)
    assert set(p16) == set(KILLS)
    # after the data files, before the commit: the unfinished save, read silently
    for crash in ("own_file.rank1.over", "own_file.all.over", "commit.rank0.over"):
        assert p16[crash].status == "fail", (crash, p16[crash])
        assert p16[crash].detail.startswith(
            "save 2 (step 3) killed at '%s'" % crash.split(".")[0]), p16[crash]
        assert ("loaded silently save 2 on every rank, although save 2 is not complete on "
                "disk (latest/.metadata is the earlier save's, not its own commit)") \
            in p16[crash].detail
        assert crash in str(failure.value)
    # rank 1 stopped as it opens its file, rank 0 wrote its own: a mix of the two saves
    mix = p16["before_file.rank1.over"]
    assert mix.status == "fail" and "loaded silently a mix of save 1 and save 2" in mix.detail
    # nothing written yet: the previous save, exactly; a torn data file: a clear error
    assert p16["start.rank0.over"].status == "pass"
    assert "restored save 1 exactly" in p16["start.rank0.over"].detail
    assert p16["torn.rank0.over"].status == "pass"
    assert "refused the incomplete checkpoint" in p16["torn.rank0.over"].detail
    # the round trip itself (no kill) passes: only the crash cases fail
    plain = [r for r in fsdp_roundtrip.results if not r.case.crash]
    assert plain and all(v.status in ("pass", "n/a") for r in plain
                         for v in r.properties.values()), plain


@pytest.mark.parametrize("fsdp_version, sizes", [(2, ["2", "2->3"]), (1, ["2"])],
                         ids=["fsdp2", "fsdp1"])
def test_step_folders_restore_the_last_complete_checkpoint(fsdp_roundtrip, fsdp_version,
                                                           sizes):
    """The same trainer under fully_shard (2 and 2 -> 3) and under FSDP1 (flat params)."""
    results = fsdp_roundtrip(make_model, data, fsdp_version=fsdp_version, plan=["0"],
                             save_fn=step_save, load_fn=step_load, world_sizes=sizes,
                             crash=KILLS, links=1)
    p16 = _p16(results)
    assert set(p16) == set(KILLS)
    for crash, v in p16.items():
        assert v.status == "pass", (crash, v)
        assert "restored save 1 exactly on every rank" in v.detail, (crash, v)
