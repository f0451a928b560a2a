"""The FSDP1 API paths, one module each (``api_paths.PATHS`` names the module of every
path), run by the one round trip of ``sut/roundtrip.py``. A path module holds its own steps
(the ``PathSteps`` protocol of ``sut.roundtrip``):

- ``save(case, model, optim, *, rank0_only=True, offload=True)``: the path's save call on
  this rank (what a trainer calls before writing); the flags are P9's, their defaults the
  path's own.
- ``write(ctx, case, live, saved, out)``: write what ``save`` returned, as a trainer would.
- ``load(ctx, case, live, saved, workdir)``: the path's load call on this rank; it returns
  the dict to pass to ``optim.load_state_dict``, or None when the path loaded the optimizer
  itself (DSD's ``set_optimizer_state_dict``).
- ``FLIP``: the P9 flip it declares (``sut.roundtrip.Flip``: the flags flipped and what the
  flip is), or None when the save has no flags to flip.

Everything else a path is (what it writes, who reads a full dict, whether it reshards, the
torch calls it depends on) is its record in ``api_paths.py``.
"""
