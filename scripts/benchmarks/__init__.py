"""Subcommands of ``scripts/bench.py``: each module has ``add_args(parser)`` and ``run(args)``."""
