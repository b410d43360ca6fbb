"""The `sfibench` commands, one module each; cli.py only assembles them into the Typer app.

A measuring command has one shape: check its options (commands/options.py) -> call its runner in
sfibench/runners/ (which claims the run directory, runs, writes results.json and renders it exactly as
`sfibench report` would) -> print a summary read back from results.json. Nothing here measures.
"""
