"""Quantities people type on the command line: sizes (`256MB`) and positive counts; and the
checks of the integer and boolean options the library's config classes take.

Plain functions (no click), so the library and its tests use the same rules and messages.
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from packtool.errors import ConfigError

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, flag: str, least: int = 1) -> int:
    """Bytes from `256MB`, `1G`, `64MiB`, `65536` (binary units: 1 MB = 2**20 bytes), at least
    `least` (`ConfigError` naming `flag` otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if m is None:
        raise ConfigError(f"{flag} {text!r}: expected a size such as 256MB, 1GB or 1048576")
    value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
    if value < least:
        unit = "1 byte" if least == 1 else f"{least:,} bytes"
        raise ConfigError(f"{flag} {text!r}: must be at least {unit}")
    return value


MIN_PARTITION_SIZE = 1024
"""`--partition-size` below 1 KB: a partition (a plan entry, a record, a worker's start) per
few bytes of input, hours for a megabyte; no corpus needs it."""


def positive_int(
    flag: str, value: str, unit: str = "tokens", least: int = 1, most: int | None = None
) -> int:
    """`value` as an integer >= `least` (1) and <= `most`, or a `ConfigError` naming `flag` (as
    typed: `--max-len`, where the library's own check names its setting, `max_len`) and the
    unit."""
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ConfigError(f"{flag} must be {what} ({unit}), got {value!r}")
    if most is not None and number > most:
        raise ConfigError(f"{flag} {number} is too large: at most {most:,} {unit}")
    return number


def check_int(
    name: str, value: Any, least: int = 1, most: int | None = None, *, optional: bool = False
) -> Any:
    """`value` as an int if it is an integer (a Python or NumPy int; not a bool, a float or a
    string) from `least` (to `most`), or None when `optional`; else a `ConfigError`: "NAME must
    be a positive integer" / "an integer >= N" / "an integer from N to M" ("None or ..." when
    `optional`), "got VALUE"."""
    if optional and value is None:
        return None
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < least or (most is not None and value > most):
        if most is not None:
            what = f"an integer from {least:,} to {most:,}"
        else:
            what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ConfigError(f"{name} must be {'None or ' if optional else ''}{what}, got {value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """`value` if it is True or False, else a `ConfigError` (a string such as 'no' is no bool:
    it would act as True)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value
