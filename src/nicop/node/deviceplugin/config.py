"""Loading the device plugins' JSON config files, with errors that name the entry and the field.

Both upstream plugins decode their config with Go's encoding/json: keys match field names
case-insensitively (`PfNames` is `pfNames`), `null` leaves a field at its zero value, unknown keys
are ignored and a wrong type is an error. nicop decodes the same way (a key in another case must
not be dropped: a selector without its `pfNames` would take every device), says which entry of
the list is wrong, and warns about unknown keys, which are usually typos that select nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """An invalid config file; the message names the file, the entry and the field."""


def read_json(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None


def entry_name(data: Any, list_key: str, index: int) -> str:
    """`resourceList[2] ("intel_sriov")`: where an entry is, and what it calls itself."""
    name = None
    if isinstance(data, dict) and isinstance(data.get(list_key), list):
        items = data[list_key]
        if index < len(items) and isinstance(items[index], dict):
            name = items[index].get("resourceName")
    return f"{list_key}[{index}]" + (f" ({json.dumps(name)})" if isinstance(name, str) else "")


def parse(model: type[M], data: Any, path: Path, list_key: str) -> M:
    """Validate `data` against `model`; the first error becomes a ConfigError naming its place."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a JSON object with {list_key!r}")
    return parse_part(model, data, lambda loc: f"{path}: {_place(data, list_key, loc)}")


def parse_part(model: type[M], data: Any, place: Callable[[tuple[Any, ...]], str]) -> M:
    """Validate a part of a config; `place` names an error location for the message."""
    try:
        parsed = model.model_validate(go_keys(model, data))
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{place(err['loc'])}: {_message(err)}") from None
    for where in _unknown_keys(parsed, ()):
        log.warning("%s: unknown key, ignored (a typo?)", place(where))
    return parsed


def go_keys(model: type[BaseModel], data: Any) -> Any:
    """`data` with its keys named as `model`'s fields, matched as Go's encoding/json matches them:
    the exact name, else the name in any case; a later key for the same field wins, and `null`
    leaves the field at its default. Nested models are treated alike; other keys stay as they are
    (and are reported as unknown)."""
    if not isinstance(data, dict):
        return data
    exact = {info.alias or name: info.annotation for name, info in model.model_fields.items()}
    folded: dict[str, str] = {}
    for key in exact:
        folded.setdefault(key.casefold(), key)
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = key if key in exact else folded.get(str(key).casefold(), str(key))
        annotation = exact.get(field)
        if value is None:
            out.pop(field, None)
            continue
        nested = _model_of(annotation)
        if nested is not None and isinstance(value, list) and _is_list(annotation):
            value = [go_keys(nested, item) for item in value]
        elif nested is not None:
            value = go_keys(nested, value)
        out[field] = value
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model inside `M`, `M | None` or `list[M]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list or any(_is_list(a) for a in get_args(annotation))


def dotted(loc: tuple[Any, ...]) -> str:
    """`selectors[0].pfNames` for ("selectors", 0, "pfNames")."""
    field = ""
    for item in loc:
        field += f"[{item}]" if isinstance(item, int) else (f".{item}" if field else str(item))
    return field


def _place(data: Any, list_key: str, loc: tuple[Any, ...]) -> str:
    """`resourceList[2] ("x"): selectors[0].pfNames` for a pydantic error location."""
    entry = ""
    rest = list(loc)
    if len(rest) >= 2 and rest[0] == list_key and isinstance(rest[1], int):
        entry = entry_name(data, list_key, rest[1])
        rest = rest[2:]
    return ": ".join(p for p in (entry, dotted(tuple(rest))) if p) or "(top level)"


def _message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return "is required"
    if "input" in err and err["type"] not in ("value_error", "assertion_error"):
        return f"{msg[0].lower()}{msg[1:]}, got {json.dumps(err['input'])}"
    return msg


def _unknown_keys(model: BaseModel, loc: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    found = [(*loc, key) for key in (model.model_extra or {})]
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        key = info.alias or name
        if isinstance(value, BaseModel):
            found += _unknown_keys(value, (*loc, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found += _unknown_keys(item, (*loc, key, i))
    return found
