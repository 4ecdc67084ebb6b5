"""The chaos soak: `python -m tests.chaos` (`nox -s chaos`), see docs/how-to/contribute.md."""
