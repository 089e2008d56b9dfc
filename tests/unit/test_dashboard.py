"""The Grafana dashboard in the chart (deploy/helm/nicop/dashboards/nicop.json): a dashboard
Grafana loads as it is, with a data source picker, whose every query parses as PromQL and asks
only for series nicop exports (read from the code at run time, so a renamed metric fails here)."""

from __future__ import annotations

from tests.monitoring import dashboard, dashboard_queries, exported_series, grafana_query_metrics

GRID_WIDTH = 24


def test_dashboard_is_a_grafana_dashboard_with_a_datasource_variable() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= grid.keys(), panel["title"]
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        # Every query goes to the data source the user picked.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["refId"] and target["expr"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_dashboard_shows_what_users_asked_for() -> None:
    queries = " ".join(q for _, q in dashboard_queries(dashboard()))
    for wanted in ("nicop_policy_ready", "nicop_component_ready", "nicop_upgrade_nodes",
                   "nicop_device_plugin_devices_allocated", "nicop_device_plugin_devices_healthy",
                   "nicop_ipam_allocated", "histogram_quantile(0.99, sum by (le, plugin, command)"
                   " (rate(nicop_cni_request_seconds_bucket", "nicop_device_plugin_registered"):
        assert wanted in queries, wanted
    # Per-node panels group by the node label the PodMonitor adds.
    assert "by (node, resource)" in queries


def test_every_query_parses_and_names_only_metrics_nicop_exports() -> None:
    exported = exported_series()
    unknown = {}
    for where, query in dashboard_queries(dashboard()):
        if missing := grafana_query_metrics(query) - exported:
            unknown[where] = sorted(missing)
    assert not unknown, f"queries name series no nicop process exports: {unknown}"
