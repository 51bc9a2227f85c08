"""`python -m toolbus`: the CLI."""

from toolbus.cli import main

main()
