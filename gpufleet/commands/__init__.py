"""The `gpufleet` subcommands: one module each, with `register` and `run`."""
