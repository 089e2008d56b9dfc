"""Timestamps as the Kubernetes API writes them (RFC 3339, UTC), one way for every caller."""

from __future__ import annotations

import datetime


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def stamp(t: datetime.datetime | None = None) -> str:
    """`2026-12-01T02:42:44Z` (seconds: metav1.Time)."""
    return (t or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_stamp(t: datetime.datetime | None = None) -> str:
    """`2026-12-01T02:42:44.123456Z` (metav1.MicroTime, as Leases carry)."""
    return (t or utcnow()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(value: str | None) -> datetime.datetime | None:
    """A timestamp of either form; None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
