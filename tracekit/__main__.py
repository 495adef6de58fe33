"""`python -m tracekit ...` is the same as the installed `tracekit ...` command."""

from tracekit.cli.main import entry

if __name__ == "__main__":
    entry()
