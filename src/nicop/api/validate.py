"""Checks the API server cannot make, for the operator to report in an object's status.

The schema checks only the shape of JSON-string fields (CEL has no JSON parser), so
`json_fields` parses them. `removed_field_warnings` lists the fields an old upstream CR still
carries; they are accepted so that the CR keeps working, and the user is told to drop them.
Both walk the model, finding the fields through the markers on their types.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel

from nicop.api.common import JsonObjectString, Removed


def _markers(annotation: Any) -> Iterator[object]:
    """The Annotated metadata of a type, looking inside unions such as `X | None`."""
    if typing.get_origin(annotation) is Annotated:
        yield from annotation.__metadata__
        yield from _markers(annotation.__origin__)
    else:
        for arg in typing.get_args(annotation):
            yield from _markers(arg)


def _fields(model: BaseModel, path: str) -> Iterator[tuple[str, object, Any]]:
    """Every set field below model: its path with JSON names, a marker on its type, its value."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if value is None:
            continue
        here = f"{path}.{info.alias or name}"
        for marker in [*info.metadata, *_markers(info.annotation)]:
            yield here, marker, value
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            if isinstance(item, BaseModel):
                yield from _fields(item, here if index is None else f"{here}[{index}]")


def _json_error(text: str, many: bool) -> str | None:
    if not text.strip():
        return None
    try:
        value = json.loads(f"[{text}]" if many else text)
    except json.JSONDecodeError as e:
        column = e.colno - 1 if many and e.lineno == 1 else e.colno
        return f"is not valid JSON: {e.msg} (line {e.lineno}, column {column})"
    if many:
        if not all(isinstance(v, dict) for v in value):
            return "must be JSON objects separated by commas, like {...}, {...}"
    elif not isinstance(value, dict):
        return f"must be a JSON object ({{...}}), not {type(value).__name__}"
    return None


def json_fields(obj: BaseModel) -> list[tuple[str, str]]:
    """(field path, error) for every JSON-string field of obj whose value does not parse,
    e.g. ("spec.ipam", "is not valid JSON: Expecting ',' delimiter (line 3, column 5)")."""
    errors = []
    for path, marker, value in _fields(obj, ""):
        if isinstance(marker, JsonObjectString):
            error = _json_error(value, marker.many)
            if error:
                errors.append((path.removeprefix("."), error))
    return errors


def removed_field_warnings(obj: BaseModel) -> list[str]:
    """One sentence per removed upstream field that obj still sets, naming the field."""
    kind = getattr(obj, "kind", "object")
    return [
        f"{path.removeprefix('.')} was removed upstream in {marker.since} ({marker.why}); "
        f"nicop ignores it, delete it from the {kind}"
        for path, marker, _ in _fields(obj, "")
        if isinstance(marker, Removed)
    ]
