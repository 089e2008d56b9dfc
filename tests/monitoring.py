"""What the chart's dashboard and alerts may query: the series nicop's processes export, read
from prometheus_client's registry after importing every nicop module, and the metric names a
PromQL expression (or a Grafana query) selects, from a real PromQL parser."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client import REGISTRY

import nicop

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "helm" / "nicop" / "dashboards" / "nicop.json"

# The series names a scrape shows for each kind of metric family.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
# Grafana's variables that stand where PromQL needs a duration.
GRAFANA_DURATIONS = re.compile(r"\$\{?__(rate_interval|interval|range)\b\}?")
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)$")


def exported_series() -> set[str]:
    """Every series name any nicop process can export (operator and agents alike)."""
    for module in pkgutil.walk_packages(nicop.__path__, "nicop."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("nicop_"):
            names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return names


def selected_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects; ValueError when it does not parse or
    selects by anything but a name."""
    expr = GRAFANA_DURATIONS.sub("5m", expr)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if not node.name:
                raise ValueError(f"{expr}: a selector without a metric name")
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def grafana_query_metrics(query: str) -> set[str]:
    """A Grafana query: PromQL, or a variable's label_values(metric, label)."""
    if match := LABEL_VALUES.match(query.strip()):
        if not match["expr"]:
            raise ValueError(f"{query}: label_values without a metric scans every series")
        return selected_metrics(match["expr"])
    return selected_metrics(query)


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, query) of every panel target and query variable."""
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets") or []:
            queries.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            queries.append((f"variable ${var['name']}", query))
    return queries
