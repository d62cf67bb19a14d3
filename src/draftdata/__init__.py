"""draftdata: token-exact training data for speculative-decoding drafters."""

# The version is written here, not read from the installed metadata: importlib.metadata costs
# 80 ms of every command's start-up. tests/test_cli_hygiene.py checks it against pyproject.toml's
# version as pip installed it.
__version__ = "0.1.0"

__all__ = ["__version__"]
