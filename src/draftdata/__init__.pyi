# The front door's types for type checkers; __init__.py imports each name on first use.
from .config.backends import register_backend as register_backend
from .records import ApiView as ApiView
from .records import Message as Message
from .records import PackedSample as PackedSample
from .records import Sample as Sample
from .session import Run as Run
from .session import open_run as open_run
from .tokens.target import Target as Target
from .tokens.target import load_target as load_target
from .version import __version__ as __version__

__all__: list[str]
