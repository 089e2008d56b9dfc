"""Label and node selectors, read and matched as Kubernetes does, in one place.

- A selector string (`app in (train,infer),tier!=db,!canary,x>1`): the grammar of
  apimachinery's `labels.Parse` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `>`, `<`), keys
  and values validated as label keys and values.
- A meta/v1 LabelSelector object (`matchLabels` and `matchExpressions` with In, NotIn, Exists,
  DoesNotExist): an empty or missing one selects everything.
- A core/v1 NodeSelector (`nodeSelectorTerms` of `matchExpressions`, which may also use Gt and
  Lt, and `matchFields` on `metadata.name`): terms ORed, an empty term selects nothing.
- A plain map (a pod's or policy's `nodeSelector`): every pair present.

What is not a valid selector raises SelectorError saying what is wrong, so that a caller
reports it instead of selecting nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
LABEL_OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)
NODE_OPERATORS = (*LABEL_OPERATORS, GT, LT)

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SPECIAL = "!=(),<>"


class SelectorError(ValueError):
    """A selector that Kubernetes would refuse; the message says why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == IN:
            return self.key in labels and labels[self.key] in self.values
        if self.operator == NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == EXISTS:
            return self.key in labels
        if self.operator == DOES_NOT_EXIST:
            return self.key not in labels
        if self.operator in (GT, LT) and self.key in labels and len(self.values) == 1:
            have, bound = _integer(labels[self.key]), _integer(next(iter(self.values)))
            if have is None or bound is None:
                return False
            return have > bound if self.operator == GT else have < bound
        return False


def requirement(key: str, operator: str, values: Iterable[str] = (),
                operators: tuple[str, ...] = NODE_OPERATORS) -> Requirement:
    """A validated requirement, as apimachinery's NewRequirement checks it."""
    problem = key_error(key)
    if problem:
        raise SelectorError(f"key {key!r}: {problem}")
    if operator not in operators:
        raise SelectorError(f"key {key!r}: operator {operator!r} is not one of "
                            f"{', '.join(operators)}")
    wanted = frozenset(values)
    if operator in (IN, NOT_IN) and not wanted:
        raise SelectorError(f"key {key!r}: {operator} needs at least one value")
    if operator in (EXISTS, DOES_NOT_EXIST) and wanted:
        raise SelectorError(f"key {key!r}: {operator} takes no values")
    if operator in (GT, LT) and (len(wanted) != 1 or _integer(next(iter(wanted))) is None):
        raise SelectorError(f"key {key!r}: {operator} needs one integer value")
    for value in wanted:
        if operator not in (GT, LT) and (problem := value_error(value)):
            raise SelectorError(f"key {key!r}: value {value!r}: {problem}")
    return Requirement(key, operator, wanted)


def key_error(key: str) -> str | None:
    """Why `key` is not a label key ([prefix/]name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix must be a DNS subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return ("the name must be 63 characters or less, alphanumeric, '-', '_' or '.', "
                "starting and ending alphanumeric")
    return None


def value_error(value: str) -> str | None:
    """Why `value` is not a label value, or None (empty is one)."""
    if value and (len(value) > 63 or not _NAME.match(value)):
        return ("a label value must be 63 characters or less, alphanumeric, '-', '_' or '.', "
                "starting and ending alphanumeric")
    return None


def _integer(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


# ----------------------------------------------------------------------- the string form

def _tokens(text: str) -> list[str]:
    """Operators, punctuation and identifiers; whitespace only separates."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            out.append(text[i:i + 2])
            i += 2
        elif ch in _SPECIAL:
            out.append(ch)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _identifier(token: str | None) -> bool:
    return token is not None and token != "" and token[0] not in _SPECIAL


def parse(text: str) -> tuple[Requirement, ...]:
    """A selector string as `labels.Parse` reads it; SelectorError when it is not one."""
    tokens = _tokens(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str | None:
        nonlocal pos
        pos += 1
        return tokens[pos - 1] if pos <= len(tokens) else None

    def fail(found: str | None, expected: str) -> SelectorError:
        return SelectorError(f"{text!r}: found {found or 'end of string'!r}, expected {expected}")

    found: list[Requirement] = []
    while peek() is not None:
        if found:  # requirements are separated by one comma
            if take() != ",":
                raise fail(tokens[pos - 1], "',' or end of string")
            if not (_identifier(peek()) or peek() == "!"):
                raise fail(peek(), "an identifier after ','")
        negated = peek() == "!"
        if negated:
            take()
        key = take()
        if not _identifier(key):
            raise fail(key, "an identifier")
        assert key is not None
        if negated or peek() in (None, ","):
            found.append(requirement(key, DOES_NOT_EXIST if negated else EXISTS))
            continue
        op = take()
        if op in ("=", "==", "!="):
            value = "" if peek() in (None, ",") else take()
            if value and not _identifier(value):
                raise fail(value, "a value")
            assert value is not None
            found.append(requirement(key, NOT_IN if op == "!=" else IN, [value]))
        elif op in (">", "<"):
            value = take()
            if not _identifier(value):
                raise fail(value, "an integer value")
            assert value is not None
            found.append(requirement(key, GT if op == ">" else LT, [value]))
        elif op in ("in", "notin"):
            found.append(requirement(key, IN if op == "in" else NOT_IN, _values(take, peek, fail)))
        else:
            raise fail(op, "one of =, ==, !=, in, notin, >, <")
    return tuple(found)


def _values(take: Any, peek: Any, fail: Any) -> set[str]:
    """The `(a,b,...)` of in/notin: empty slots (`()`, `(a,)`, `(,a)`, `(a,,b)`) are "", two
    identifiers need a comma between them."""
    if (opening := take()) != "(":
        raise fail(opening, "'('")
    values: set[str] = set()
    slot_open = True  # a value may come; a comma or ')' here leaves an empty value
    while True:
        token = take()
        if token == ")":
            if slot_open:
                values.add("")
            return values
        if token == ",":
            if slot_open:
                values.add("")
            slot_open = True
        elif _identifier(token) and slot_open:
            values.add(token)
            slot_open = False
        else:
            raise fail(token, "',', ')' or a value")


def matches_string(text: str, labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy the selector string `text` (empty: everything)."""
    return all(r.matches(labels) for r in parse(text))


# ----------------------------------------------------------------------- the object forms

def label_selector(selector: Mapping[str, Any] | None) -> tuple[Requirement, ...]:
    """A meta/v1 LabelSelector's requirements (none: it selects everything)."""
    selector = selector or {}
    found = [requirement(k, IN, [str(v)], LABEL_OPERATORS)
             for k, v in (selector.get("matchLabels") or {}).items()]
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        try:
            found.append(requirement(expr.get("key", ""), expr.get("operator", ""),
                                     expr.get("values") or [], LABEL_OPERATORS))
        except SelectorError as e:
            raise SelectorError(f"matchExpressions[{i}]: {e}") from None
    return tuple(found)


def matches_label_selector(selector: Mapping[str, Any] | None,
                           labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in label_selector(selector))


def matches_map(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    """A plain `nodeSelector` map: every pair present with that value."""
    return all(k in labels and labels[k] == v for k, v in (selector or {}).items())


def node_selector(selector: Mapping[str, Any] | None) -> Callable[[Mapping[str, Any]], bool]:
    """core/v1 NodeSelector as a test of nodes, read once (a DaemonSet's placement asks it of
    every node): terms ORed, requirements ANDed, an empty term selects nothing; no selector
    selects every node."""
    if not selector:
        return lambda node: True
    terms = [([_node_requirement(r) for r in term.get("matchExpressions") or []],
              [_node_requirement(r) for r in term.get("matchFields") or []])
             for term in selector.get("nodeSelectorTerms") or []]
    terms = [(exprs, fields) for exprs, fields in terms if exprs or fields]

    def selects(node: Mapping[str, Any]) -> bool:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        fields = {"metadata.name": meta.get("name", "")}
        return any(all(r.matches(labels) for r in exprs) and
                   all(r.matches(fields) for r in field_reqs) for exprs, field_reqs in terms)
    return selects


def matches_node_selector(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    return node_selector(selector)(node)


def _node_requirement(expr: Mapping[str, Any]) -> Requirement:
    return requirement(expr.get("key", ""), expr.get("operator", ""), expr.get("values") or [])
