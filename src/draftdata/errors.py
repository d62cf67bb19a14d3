"""One root exception; one subclass per stage. Messages name the problem and the fix."""

from __future__ import annotations


class DraftdataError(Exception):
    """Root of every error draftdata raises on purpose.

    The CLI prints ``str(error)`` as one line and exits with ``exit_code``.
    """

    exit_code = 2


class TokenizerError(DraftdataError):
    """A tokenizer file could not be found, read or understood."""


class SpecialTokenInTextError(TokenizerError):
    """Text handed to an ordinary-text encode would have produced a control token."""


class FormatError(DraftdataError):
    """A chat format is unknown, malformed, or does not fit the tokenizer it is bound to."""


class MarkerError(FormatError):
    """A format marker does not resolve to one verified special/added token."""


class InputError(DraftdataError):
    """An input file or record is unreadable or malformed."""


class ReconstructError(DraftdataError):
    """An API response cannot be turned into ids under this format (counted as a drop)."""

    def __init__(self, message: str, reason: str = "unreconstructable") -> None:
        super().__init__(message)
        self.reason = reason


class GenerateError(DraftdataError):
    """Generation cannot start or continue."""


class AcceptanceError(DraftdataError):
    """A drafter cannot be measured: no engine, a busy server, a drafter it cannot load."""
