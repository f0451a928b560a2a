"""Scale mode: a model's ``fully_shard`` layout at the world sizes users run, checked on one
machine (torch's fake process group, meta tensors): models (built-in shapes), simulate (one
rank of thousands), check (against the reference), cli (``fsdp-conformance scale``)."""
