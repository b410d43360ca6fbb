"""The measuring commands' runners, one module per command: validate -> run -> write results.json -> render.

Why a package of its own beside engine/, not engine/runs/: a runner sits above both the engine and
reporting. It drives the engine (sessions, the step driver) and the metrics, then writes results.json
and renders it through reporting/ exactly as `sfibench report` would. Inside engine/ it would make the
engine import reporting; here every package imports downward only:

    commands/ -> runners/ -> reporting/ (results.json, plots, markdown) -> metrics/
                         \\-> engine/, methods, workloads, metrics

reporting/ never imports a runner, so a saved run can be redrawn and gated without the engine loaded.
"""
