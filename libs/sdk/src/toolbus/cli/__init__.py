"""The `toolbus` command line (`toolbus --help`); `main` is the console-script entry point."""

from toolbus.cli._app import EXIT_CODES, app, main

__all__ = ["EXIT_CODES", "app", "main"]
