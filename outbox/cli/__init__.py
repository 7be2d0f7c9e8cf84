"""`odal outbox`, one module per area (as Django keeps one command per file): each module's
`add_arguments(sub)` adds its subcommands to the command's subparsers, with the function that
runs each as the parser's `handler` default; outbox/management/commands/outbox.py only
dispatches. A handler takes the command (for its stdout and stderr) and the parsed options."""
