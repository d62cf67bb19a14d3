"""draftdata's version, in a module of its own below every other: each layer stamps it on what it
writes, and the package's front door (``draftdata/__init__.py``) sits above them all.

It is written here, not read from the installed metadata: importlib.metadata costs 80 ms of
every command's start-up. tests/test_cli_hygiene.py checks it against pyproject.toml's version as
pip installed it."""

__version__ = "0.1.0"
