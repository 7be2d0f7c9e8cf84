"""`odal registry`, one module per area, laid out as `odal outbox`'s (outbox/cli): each module's
`add_arguments(sub)` adds its subcommands, with the function that runs each as the parser's
`handler` default; registry/management/commands/registry.py only dispatches."""
