"""The error hierarchy the CLI turns into one readable line and a non-zero exit code."""

from __future__ import annotations


class PacktoolError(Exception):
    """Base class for every error a user can act on (no traceback is shown for these)."""


class ConfigError(PacktoolError, ValueError):
    """An option or argument has an invalid value; the message names it and the valid choices."""


class DataError(PacktoolError):
    """Input data is missing, unreadable or malformed; the message names the file (and line)."""


class MissingDependencyError(PacktoolError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""
