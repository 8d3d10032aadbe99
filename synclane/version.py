"""The version of synclane: a leaf module, so that any part (a worker's row, `--version`) can
read it without importing the package root and, through it, the app. pyproject.toml reads it
from here too."""

__version__ = "0.2.0"
