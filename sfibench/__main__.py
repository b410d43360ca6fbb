"""`python -m sfibench ...` is the same as the `sfibench` console script."""

from sfibench.cli import main

main()
