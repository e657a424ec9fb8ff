"""Data mixtures: named sources with weights and caps, the mixture file, and `packtool mix`.

A mixture is a list of sources (a name, a packed dataset folder, a weight, an optional cap on
repetitions and what happens at the cap) plus the unit the weights count (`tokens` or `rows`),
a seed and an optional total length. This module holds the description and its checks (pure,
no torch): `MixtureSpec`, `read_mixture_file` (JSON, or YAML when PyYAML is installed),
`check_compatible` (one tokenizer and one max_len), `check_distinct_data` (no two sources on
the same data) and `plan_mixture`, which runs the loader's
own schedule (`packtool.mixture.schedule`) on the sizes in each source's `index.json` for `packtool mix`.
The loader's `MixedDataset` (loader/mixture/dataset.py) takes the same `MixtureSpec`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packtool.dataset.identity import IDENTITY_FIELDS
from packtool.errors import ConfigError, MissingDependencyError, json_value, option_choice
from packtool.storage import local as storage

UNITS = ("tokens", "rows")
"""What a weight counts: tokens delivered (default) or packed rows."""
AT_CAP = ("stop", "drop")
"""At a source's `max_epochs`: end the whole mixture, or drop the source and renormalise."""
SOURCE_KEYS = ("name", "path", "weight", "max_epochs", "at_cap")
FILE_KEYS = ("sources", "unit", "seed", "total_tokens", "total_steps")


def _exponent_hint(value: Any) -> str:
    """Why YAML kept `value` as text when it is a number with an exponent, and how to write it:
    YAML 1.1 (PyYAML) reads an exponent as a number only after a dot and with a sign."""
    match = isinstance(value, str) and re.fullmatch(r"([0-9]*\.?[0-9]*)[eE]([-+]?)([0-9]+)", value)
    if not match or match.group(1) in ("", "."):
        return ""
    mantissa, sign, exponent = match.groups()
    if "." not in mantissa:
        mantissa += ".0"
    elif mantissa.endswith("."):
        mantissa += "0"
    elif mantissa.startswith("."):
        mantissa = "0" + mantissa
    number = float(value)
    plain = f"{number:.15g}" if math.isfinite(number) else "e"
    plain = "" if "e" in plain else plain  # a plain decimal only where it is short
    written = f"{mantissa}e{sign or '+'}{exponent}"
    return f" (YAML reads {value} as text: write {plain + ' or ' if plain else ''}{written})"


def _at_cap_without_cap(name: str, at_cap: Any) -> str:
    return (
        f"source {_shown(name)}: at_cap {_shown(at_cap)} without max_epochs does nothing (it says what "
        "happens at the cap); give max_epochs or remove at_cap"
    )


def _shown(value: Any) -> str:
    """`repr(value)` cut short: a value in a message may be anything a file holds (a YAML
    file of a few hundred bytes whose aliases nest 9^9 items made `repr` run out of memory)."""
    import reprlib

    short = reprlib.Repr()  # (keyword arguments from Python 3.12 only)
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 2, 4, 4, 80, 80
    text = short.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def _plain(value: Any, what: str) -> Any:
    """`value` with a numpy number made the Python int or float of the same value (json, the
    mixture's fingerprint and `Fraction` take no numpy scalar); anything else as it is.

    Raises:
        ConfigError: A numpy float a Python float cannot hold exactly (a long double).
    """
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        plain = float(value)
        if math.isfinite(plain) and plain != value:
            raise ConfigError(
                f"{what} {_shown(value)} is a {type(value).__name__} that a float64 cannot hold "
                "exactly; give a Python float"
            )
        return plain
    return value


MAX_COUNT = 2**62
"""The largest total a mixture takes (tokens or steps): the schedule counts in int64."""


def parse_count(value: Any, what: str) -> int:
    """A positive integer count: an int, or text like `10B`, `2.5M`, `1_000` (K, M, B/G, T) or
    `1e9`, `1.0e+9`, `2.5e6` (an exponent; YAML 1.1 keeps `1e9` as text), read exactly.

    Raises:
        ConfigError: Anything else (the message names `what`).
    """
    n = None
    if _is_number(value) and float(value).is_integer() and value > 0:
        n = int(value)
    elif isinstance(value, str):
        exact = _exact_count(value)
        if exact is not None and exact > MAX_COUNT:  # before an int of 10**999999999 is made
            raise ConfigError(f"{what} {_shown(value)} is too large: at most {MAX_COUNT:,} (2**62)")
        if exact is not None and exact >= 1 and exact == exact.to_integral_value():
            n = int(exact)
    if n is None:
        raise ConfigError(
            f"{what} must be a positive whole number (e.g. 1000000, 10B, 2.5M, 1e9), got "
            f"{_shown(value)}"
        )
    if n > MAX_COUNT:  # the schedule counts in int64 (a numba traceback past it)
        raise ConfigError(f"{what} {n:,} is too large: at most {MAX_COUNT:,} (2**62)")
    return n


def _exact_count(text: str) -> Any:
    """The `decimal.Decimal` that count text stands for, exactly (a float rounded 10**30 to
    1000...19884624838656), or None where it is no count's form."""
    from decimal import Decimal, InvalidOperation

    m = re.fullmatch(
        r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)(?:[eE]([-+]?[0-9]+)|\s*([kKmMbBgGtT]?))\s*", text
    )
    if not m:
        return None
    digits, exponent, suffix = m.groups()
    if exponent is None:
        exponent = {"": 0, "k": 3, "m": 6, "b": 9, "g": 9, "t": 12}[suffix.lower()]
    try:  # built from the text, a Decimal is exact whatever its digits (arithmetic would round)
        return Decimal(f"{digits.replace('_', '')}e{exponent}")
    except InvalidOperation:  # an exponent past Decimal's range
        return None


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """One source of a mixture. A numpy number as `weight` or `max_epochs` is stored as the
    Python int or float of the same value (`ConfigError` for a long double a float64 cannot
    hold exactly)."""

    name: str
    """Unique within the mixture; the resume state keys each source's cursor by it."""
    path: Any
    """A packed dataset folder (`packtool pack` output). In Python also a `PackedDataset` or a
    `StreamingPackedDataset` (loader/mixture/dataset.py reads its data and settings)."""
    weight: float | None = None
    """Relative weight (>= 0; normalised over the sources), required: a source without one is a
    `ConfigError` (no weight is assumed). 0 keeps a source's cursor without drawing from it."""
    max_epochs: float | None = None
    """Most passes over the source (e.g. 2, or 0.5 for its first half per its epoch order);
    None: repeated as long as the mixture runs."""
    at_cap: str = "stop"
    """At `max_epochs`: `stop` ends the whole mixture, `drop` removes the source and
    renormalises the others' weights (reported). `drop` without `max_epochs` is refused (it
    would do nothing)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"a source name must be a non-empty string, got {_shown(self.name)}")
        for key in ("weight", "max_epochs"):  # numpy numbers: the Python number of that value
            value = _plain(getattr(self, key), f"source {_shown(self.name)}: {key}")
            object.__setattr__(self, key, value)
        if self.weight is None:
            raise ConfigError(
                f"source {_shown(self.name)} has no weight; give it one (a number >= 0, relative to "
                "the other sources' weights)"
            )
        if not _is_number(self.weight):
            hint = _exponent_hint(self.weight)
            raise ConfigError(
                f"source {_shown(self.name)}: weight must be a number, got {_shown(self.weight)}{hint}"
            )
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ConfigError(
                f"source {_shown(self.name)}: weight must be a finite number >= 0, got {_shown(self.weight)}"
            )
        if self.max_epochs is not None and (
            not _is_number(self.max_epochs)
            or not math.isfinite(self.max_epochs)
            or self.max_epochs <= 0
        ):
            raise ConfigError(
                f"source {_shown(self.name)}: max_epochs must be a number > 0 or null, got "
                f"{_shown(self.max_epochs)}"
            )
        if self.at_cap not in AT_CAP:
            raise ConfigError(
                f"source {_shown(self.name)}: at_cap {_shown(self.at_cap)} is unknown; choose one of "
                f"{list(AT_CAP)}"
            )
        if self.at_cap == "drop" and self.max_epochs is None:
            raise ConfigError(_at_cap_without_cap(self.name, self.at_cap))


@dataclass(frozen=True, kw_only=True)
class MixtureSpec:
    """A mixture: its sources, the unit its weights count, its seed and total length."""

    sources: tuple[SourceSpec, ...]
    unit: str = "tokens"
    """`tokens` (weights are shares of the tokens delivered) or `rows` (of packed rows)."""
    seed: int = 0
    """Seeds every source's epoch order (with the source's fingerprint and epoch); a numpy
    integer is stored as the Python int."""
    total_tokens: int | None = None
    """End the mixture once this many tokens are delivered (the last step may be partial)."""
    total_steps: int | None = None
    """End the mixture after this many global steps."""
    origin: str = field(default="", compare=False)
    """Where the spec came from (a file), for messages."""

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        object.__setattr__(self, "sources", sources)
        if not sources:
            raise ConfigError(f"{self._where()}a mixture needs at least one source")
        for s in sources:
            if not isinstance(s, SourceSpec):
                raise ConfigError(f"{self._where()}sources must be SourceSpec, got {_shown(s)}")
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"{self._where()}duplicate source name(s) {', '.join(map(repr, dupes))}; "
                "every source needs its own name"
            )
        if not any(s.weight > 0 for s in sources):
            raise ConfigError(
                f"{self._where()}every source has weight 0; give at least one a weight > 0"
            )
        try:  # the schedule normalises by the sum: 1e308 + 1e308 overflows
            math.fsum(float(s.weight) for s in sources)
        except OverflowError:
            raise ConfigError(
                f"{self._where()}the weights sum past the largest float; scale them down "
                "(only their ratios count)"
            ) from None
        if self.unit not in UNITS:
            raise ConfigError(f"unit {_shown(self.unit)} is unknown; choose one of {list(UNITS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise ConfigError(f"seed must be an integer, got {_shown(self.seed)}")
        object.__setattr__(self, "seed", int(self.seed))  # a numpy integer: json takes an int
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {_shown(self.seed)}")
        for key in ("total_tokens", "total_steps"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, parse_count(value, key))
        if self.total_tokens is not None and self.total_steps is not None:
            raise ConfigError("give total_tokens or total_steps, not both")

    def _where(self) -> str:
        return f"{self.origin}: " if self.origin else ""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def weights(self) -> dict[str, float]:
        """Each source's share (weights normalised to sum to 1)."""
        total = math.fsum(float(s.weight) for s in self.sources)
        return {s.name: float(s.weight) / total for s in self.sources}

    def source(self, name: str) -> SourceSpec:
        for s in self.sources:
            if s.name == name:
                return s
        raise ConfigError(f"unknown source {_shown(name)}; the mixture has {', '.join(self.names)}")

    def with_weights(self, weights: Mapping[str, float]) -> MixtureSpec:
        """The same mixture with some sources' weights changed (names checked)."""
        for name in weights:
            self.source(name)
        sources = tuple(
            replace(s, weight=weights[s.name]) if s.name in weights else s for s in self.sources
        )
        return replace(self, sources=sources)

    def ends(self) -> bool:
        """Whether the mixture has an end: a total length, a source that stops it at its cap,
        or a cap on every source with a weight."""
        if self.total_tokens is not None or self.total_steps is not None:
            return True
        drawn = [s for s in self.sources if s.weight > 0]
        return any(s.max_epochs is not None and s.at_cap == "stop" for s in drawn) or all(
            s.max_epochs is not None for s in drawn
        )


# --- the mixture file ------------------------------------------------------------------------


def _names(keys: Any, where: str) -> set[str]:
    """The keys of a mapping of the mixture file, each a string (a number beside strings, null,
    or a list as a YAML key is one line, not a TypeError sorting or hashing them)."""
    for key in keys:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: key {_shown(key)} is not a string; {_KEYS_ARE}")
    return set(keys)


_KEYS_ARE = (
    f"the keys of a mixture are names ({', '.join(FILE_KEYS)}; a source's {', '.join(SOURCE_KEYS)})"
)


class _KeyCheck:
    """The mappings of one mixture file as they are parsed (JSON's `object_pairs_hook`, the YAML
    loader's mapping constructor). A key that is not a string or appears twice is noted against
    its mapping, not raised: only once the whole file is read is it known whose mapping it is,
    the file's or a source's, and the message names the source (`check`). Raised at once, it
    named the file alone: `m.yaml: key 'weight' appears twice`, in which of 40 sources?"""

    def __init__(self) -> None:
        self.flaws: list[tuple[dict[str, Any], str]] = []
        """(the mapping as read, its keys' fault), in the order they were parsed."""

    def __call__(self, pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        odd = next((key for key, _ in pairs if not isinstance(key, str)), _KeyCheck)
        twice = None
        for key, value in pairs:
            if not isinstance(key, str):
                continue  # (it may be a list: unhashable) the fault is `odd`
            if key in out and twice is None:
                twice = key
            out.setdefault(key, value)
        if odd is not _KeyCheck:
            self.flaws.append((out, f"key {_shown(odd)} is not a string; {_KEYS_ARE}"))
        elif twice is not None:
            self.flaws.append((out, f"key {_shown(twice)} appears twice; keep one"))
        return out

    def check(self, data: Any, where: str) -> None:
        """Raise the first fault, naming the source whose mapping (or whose value) holds it;
        the file's own mapping first, then the sources in order, then any other mapping (not
        searched for: YAML's aliases can make a file of billions of items)."""
        if not self.flaws:
            return
        for mapping, why in self.flaws:
            if mapping is data:
                raise ConfigError(f"{where}: {why}")
        sources = data.get("sources") if isinstance(data, dict) else None
        for i, entry in enumerate(sources if isinstance(sources, list) else ()):
            if not isinstance(entry, dict):
                continue
            inside = [entry, *(v for v in entry.values() if isinstance(v, dict))]
            for mapping, why in self.flaws:
                if any(mapping is m for m in inside):
                    label = entry.get("name", f"sources[{i}]")
                    raise ConfigError(f"{where}: source {_shown(label)}: {why}")
        raise ConfigError(f"{where}: {self.flaws[0][1]}")


def _load_yaml(text: str, where: str, keys: _KeyCheck) -> Any:
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError(
            f"{where}: reading YAML needs PyYAML (`pip install pyyaml`), or write the mixture "
            "as JSON"
        ) from None

    # libyaml's parser where PyYAML has it: PyYAML's own scanner, for every token, goes over the
    # simple keys still possible at each open flow level (`[[[[...` keeps up to 1,024), so a
    # file nested too deeply took seconds before the recursion limit stopped it (more under a
    # raised limit); libyaml refuses it past 1,000 levels at once. Constructing stays Python's.
    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        pass

    def mapping(loader: Any, node: Any) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        # a key in full (a list as a key is filled later otherwise): the message shows it
        pairs = [
            (loader.construct_object(k, deep=True), loader.construct_object(v))
            for k, v in node.value
        ]
        return keys(pairs)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        if getattr(exc, "problem", None) == "exceeded maximum nesting depth":  # libyaml's limit
            raise ConfigError(f"{where}: not valid YAML (nested too deeply)") from None
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:  # PyYAML's composer and constructor recurse, as json's parser does
        raise ConfigError(f"{where}: not valid YAML (nested too deeply)") from None


def read_mixture_file(path: str | os.PathLike) -> MixtureSpec:
    """Read a mixture file (`.json`, or `.yaml` / `.yml` with PyYAML).

    Relative source paths are taken relative to the file's folder. Duplicate keys, unknown keys
    and values of the wrong type are refused with one line naming them.

    Raises:
        ConfigError: The file is missing or malformed.
        MissingDependencyError: A YAML file without PyYAML installed.
    """
    file = Path(path)
    where = str(file)
    try:
        text = storage.read_text(file)
    except FileNotFoundError:
        raise ConfigError(f"{where}: mixture file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read the mixture file ({exc})") from None
    keys = _KeyCheck()
    if file.suffix.lower() in (".yaml", ".yml"):
        data = _load_yaml(text, where, keys)
    else:
        try:
            data = json_value(text, object_pairs_hook=keys)
        except ValueError as exc:  # JSONDecodeError, or nested too deeply (`json_value`)
            raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    keys.check(data, where)
    return mixture_from_dict(data, base=file.parent, origin=where)


def mixture_from_dict(
    data: Any, *, base: str | os.PathLike | None = None, origin: str = "mixture"
) -> MixtureSpec:
    """A `MixtureSpec` from the parsed mixture file (`base`: folder for relative paths)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: a mixture is a mapping with a `sources` list")
    unknown = sorted(_names(data, origin) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(map(repr, unknown))}; a mixture takes "
            f"{', '.join(FILE_KEYS)}"
        )
    raw = data.get("sources")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{origin}: `sources` must be a non-empty list of {{name, path, ...}}")
    sources = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ConfigError(f"{origin}: sources[{i}] must be a mapping, got {_shown(entry)}")
        label = entry.get("name", f"sources[{i}]")
        bad = sorted(_names(entry, f"{origin}: source {_shown(label)}") - set(SOURCE_KEYS))
        if bad:
            raise ConfigError(
                f"{origin}: source {_shown(label)}: unknown key(s) {', '.join(map(repr, bad))}; a "
                f"source takes {', '.join(SOURCE_KEYS)}"
            )
        for key in ("name", "path", "weight"):
            if key not in entry:
                hint = ""
                if key == "weight":
                    hint = " (a number >= 0, relative to the others; no weight is assumed)"
                raise ConfigError(f"{origin}: source {_shown(label)} has no {_shown(key)}{hint}")
        p = entry["path"]
        if not isinstance(p, str) or not p:
            raise ConfigError(
                f"{origin}: source {_shown(label)}: path must be a folder or a URL, got {_shown(p)}"
            )
        if base is not None and not os.path.isabs(p) and "://" not in p:  # a URL is absolute
            p = str(Path(base) / p)
        if "at_cap" in entry and entry.get("max_epochs") is None:
            raise ConfigError(f"{origin}: {_at_cap_without_cap(label, entry['at_cap'])}")
        kwargs = {k: entry[k] for k in ("weight", "max_epochs", "at_cap") if k in entry}
        sources.append(SourceSpec(name=entry["name"], path=p, **kwargs))
    kwargs = {k: data[k] for k in ("unit", "seed", "total_tokens", "total_steps") if k in data}
    return MixtureSpec(sources=tuple(sources), origin=origin, **kwargs)


# --- what the sources must share ---------------------------------------------------------------


def check_compatible(entries: Sequence[tuple[str, Mapping[str, Any], int]]) -> None:
    """Refuse sources that were packed with different tokenizers or max_len.

    Args:
        entries: `(name, tokenizer identity dict, max_len)` per source.

    Raises:
        ConfigError: One line naming the field that differs and each source's value.
    """
    if len({int(m) for _, _, m in entries}) > 1:
        values = ", ".join(f"{n} {m}" for n, _, m in entries)
        raise ConfigError(
            f"the sources were packed with different max_len ({values}); pack them with one "
            + option_choice("--max-len", "max_len", "N")
        )
    for key in IDENTITY_FIELDS:  # as TokenizerIdentity.matches compares
        if len({repr(t.get(key)) for _, t, _ in entries}) > 1:
            values = ", ".join(
                f"{n} {t.get('name', '?')} ({key} {t.get(key)!r})" for n, t, _ in entries
            )
            raise ConfigError(
                f"the sources were packed with different tokenizers ({values}); a mixture needs "
                "one tokenizer"
            )


def check_distinct_data(entries: Sequence[tuple[SourceSpec, object, str]]) -> None:
    """Refuse two sources on the same data: an epoch order is seeded by the mixture's seed,
    the data's fingerprint and the epoch, so both would walk the same rows in the same order and
    every row would come twice (a copy-pasted path, or a copy of a folder).

    Args:
        entries: `(source, its data, that data in words)` per source: a packed dataset's data
            is its fingerprint (its shards: a copy of the folder is the same data), a
            streaming source's its files' resolved paths (its fingerprint, which a resume
            compares, is those files with their sizes and modification times).

    Raises:
        ConfigError: One line naming both sources and the weight one source would take.
    """
    seen: dict[object, SourceSpec] = {}
    for source, data, shown in entries:
        first = seen.setdefault(data, source)
        if first is not source:
            raise ConfigError(
                f"sources {first.name!r} and {source.name!r} are the same data ({shown}): "
                "every row would come twice; use one source with their summed weight "
                f"({first.weight + source.weight:g})"
            )
