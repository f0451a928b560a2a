"""The FSDP2 API paths (``fully_shard`` + ``torch.distributed.checkpoint.state_dict``), one
module each (``api_paths.PATHS`` names the module of every path), run by the one round
trip of ``sut/roundtrip.py``. A path module holds its own steps (the ``PathSteps``
protocol of ``sut.roundtrip``):

- ``save(case, model, optim, *, cpu_offload=...)``: the path's save call on this rank (the
  flag is P9's; its default the path's own);
- ``write(ctx, case, live, saved, out)``: write what ``save`` returned, as a trainer would;
- ``load(ctx, case, live, saved, workdir)``: the path's load call on this rank (it loads the
  optimizer itself: None);
- ``FLIP``: the P9 flip it declares (``sut.roundtrip.Flip``).

Every state-dict call passes the case's ``StateDictOptions`` (``sut.fsdp2.state_dict_options``:
``flatten_optimizer_state_dict`` and ``ignore_frozen_params`` where the case says;
``strict=False`` on a ``Case.nonstrict`` load). Everything else a path is (what it writes,
who reads a full dict, the case axes only it takes) is its record in ``api_paths.py``.
"""
