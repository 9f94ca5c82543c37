"""``python -m rayito_constructs``: the same as the ``rayito-constructs`` command."""

from .cli import run

run()
