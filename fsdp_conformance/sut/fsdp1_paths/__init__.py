"""The FSDP1 API paths, one module each (``sut.registry.PATHS`` names the module of every
path). A path module holds its own steps and hands the shared round trip of ``sut.paths``
(``save_side`` / ``load_side``, the ``PathSides`` protocol) to the pools:

- ``save(case, model, optim, *, rank0_only=True, offload=True)``: the path's save call on
  this rank (what a trainer calls before writing); the flags are P9's, their defaults the
  path's own (``sut.paths.save_path`` passes ``offload`` only when told).
- ``write(ctx, case, model, saved, out)``: write what ``save`` returned, as a trainer would.
- ``load(ctx, case, model, optim, saved, workdir)``: the path's load call on this rank; it
  returns the dict to pass to ``optim.load_state_dict``, or None when the path loaded the
  optimizer itself (DSD's ``set_optimizer_state_dict``).
- ``P9_FLIP``: (the ``SaveRecord`` field, the flags) of the same save with its flags flipped,
  or None when the save has no flags to flip.

Everything else a path is (what it writes, who reads a full dict, whether it reshards, the
torch calls it depends on) is its record in ``sut/registry.py``.
"""
