"""The chat's defaults from the config file's [chat] table; a flag given on the command line wins.

    [chat]
    k = "auto"            # or a number of draft tokens per round (0: the service writes every token)
    temperature = 0.7
    system = "Answer briefly."
    marks = false         # start with rendered Markdown (code coloured by token, prose by gutter) instead of raw text

The file is the one the model pairs live in (`SPECWIRE_CONFIG`, default
~/.config/specwire/config.toml). A wrong value is a UserError that names the file and the key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from app.generation_flags import parse_k
from app.user_error import UserError

class _FromConfig:
    def __repr__(self) -> str:
        return "FROM_CONFIG"


# The chat parser's default for these flags: not given, the file decides. Not a string: argparse
# would run a string default through the flag's type.
FROM_CONFIG = _FromConfig()


@dataclass(frozen=True)
class ChatDefaults:
    k: int | None = None  # auto
    temperature: float = 0.0  # greedy
    system: str | None = None  # the resumed chat's, or the template's
    marks: bool = True


def chat_defaults(path: Path | None = None) -> ChatDefaults:
    from models.registry import config_path

    path = path or config_path()
    if not path.is_file():
        return ChatDefaults()
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("chat", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read the config file {path}: {exc}") from exc
    unknown = set(table) - {"k", "temperature", "system", "marks"}
    if unknown:
        raise UserError(f"{path}: [chat] has no setting {', '.join(sorted(unknown))} "
                        "(there are k, temperature, system, marks)")
    defaults = ChatDefaults()
    try:
        k = parse_k(str(table["k"])) if "k" in table else defaults.k
    except ValueError as exc:
        raise UserError(f"{path}: [chat] k: {exc}") from exc
    temperature = table.get("temperature", defaults.temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise UserError(f"{path}: [chat] temperature must be a number, got {temperature!r}")
    system = table.get("system", defaults.system)
    if system is not None and not isinstance(system, str):
        raise UserError(f"{path}: [chat] system must be a string, got {system!r}")
    marks = table.get("marks", defaults.marks)
    if not isinstance(marks, bool):
        raise UserError(f"{path}: [chat] marks must be true or false, got {marks!r}")
    return ChatDefaults(k=k, temperature=float(temperature), system=system, marks=marks)
