"""The ``autotune`` command: one private module per subcommand (``_search``, ``_show``, ...), each with
``register(subparsers)`` and ``run(args) -> exit status``; ``_main`` parses and turns errors into one line.
"""

from autotune.cli._main import main

__all__ = ["main"]
