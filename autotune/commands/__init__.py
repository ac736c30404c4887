"""One module per `autotune` subcommand: register(subparsers) adds it, run(args) -> exit status."""
