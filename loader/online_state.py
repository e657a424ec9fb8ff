"""The `OnlinePacker` checkpoint: what `state_dict()` holds, checked before `load_state_dict()`."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from loader.config import OnlineConfig
from packtool.errors import DataError

STATE_KEYS = frozenset(
    (
        "config",
        "seed_key",
        "buffer",
        "out",
        "has_tokens",
        "dtype",
        "counts",
        "packs",
        "held_rows",
        "forced_rows",
        "flushes",
        "next_doc_id",
        "closed",
    )
)
"""The keys of `OnlinePacker.state_dict()`."""


def config_state(config: OnlineConfig) -> dict[str, Any]:
    """The settings as a plain dict (what a state records, and compares on load)."""
    return {f.name: getattr(config, f.name) for f in fields(config)}


def check_packer_state(state: Any, config: OnlineConfig) -> None:
    """Refuse what is not an `OnlinePacker` state saved with `config`.

    Raises:
        DataError: Not a packer state, or one saved with other settings.
    """
    missing = sorted(STATE_KEYS - set(state)) if isinstance(state, dict) else sorted(STATE_KEYS)
    if missing or not isinstance(state["config"], dict) or not isinstance(state["counts"], dict):
        raise DataError(
            "not an OnlinePacker state (from state_dict()): "
            + (f"missing {', '.join(missing)}" if missing else "config or counts malformed")
        )
    mine = config_state(config)
    if state["config"] != mine:
        diff = sorted(k for k in mine if state["config"].get(k) != mine[k])
        raise DataError(f"the packer state was saved with other settings ({', '.join(diff)})")
