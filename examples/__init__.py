"""Examples of testing your own model with the fsdp-conformance pytest plugin."""
