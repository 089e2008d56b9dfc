"""The bundle's HTML page from files alone: what it shows, that nothing in it reaches the
network, and that text from the cluster (a log line, an event) is shown, never run. The page
rendered in a real browser from a live cluster's bundle is in
tests/integration/test_support_tools.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import yaml

from nicop import report

MANIFEST = {"createdAt": "2026-12-07T10:00:00Z", "nicopVersion": "0.1.0",
            "namespace": "nvidia-network-operator",
            "notCollected": [{"item": "log of x", "reason": "403 Forbidden"}]}
FILES = {
    "status.json": json.dumps({"policy": {"name": "nic-cluster-policy", "state": "notReady",
                                          "message": "not ready: state-OFED", "components": [
                                              {"name": "state-OFED", "state": "notReady",
                                               "message": "1 of 2 pods available"}]},
                               "nodes": [{"name": "gpu-1", "ready": True, "managed": True,
                                          "driver": {"version": "24.10", "ready": False,
                                                     "problem": "CrashLoopBackOff"},
                                          "upgradeState": "upgrade-failed",
                                          "drainBlocked": "work/db (PodDisruptionBudget)",
                                          "resources": [{"name": "nvidia.com/rdma",
                                                         "capacity": "63", "allocatable": "63",
                                                         "inUse": 1}], "sriov": None}],
                               "driverUpgrade": {"done": 1, "inProgress": 0, "waiting": 0,
                                                 "failed": 1, "failedNodes": ["gpu-1"]}}),
    "diagnose.json": json.dumps({"summary": {"fail": 1, "warn": 0, "pass": 1}, "checks": [
        {"subject": "cluster", "name": "policy", "result": "pass", "message": "all good"},
        {"subject": "node/gpu-1", "name": "driver", "result": "fail",
         "message": "the driver container crashes", "fix": "kubectl logs <pod> -c mofed"}]}),
    "resources/sriovnetworknodestates.sriovnetwork.openshift.io.yaml": yaml.safe_dump([
        {"metadata": {"name": "gpu-1"}, "status": {"interfaces": [
            {"name": "ens1f0np0", "pciAddress": "0000:08:00.0", "deviceID": "101d",
             "linkType": "ETH", "numVfs": 8, "totalvfs": 16}]}}]),
    "nodes/events.yaml": yaml.safe_dump([
        {"type": "Warning", "reason": "DriverFailed", "message": "<img src=x onerror=alert(1)>",
         "lastTimestamp": "2026-12-07T09:00:00Z", "involvedObject": {"kind": "Node",
                                                                       "name": "gpu-1"}}]),
    "logs/mofed-ds-abc/mofed.log":
        "loading\nERROR: modprobe mlx5_core failed\n<script>x()</script>\n",
}


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def page() -> tuple[str, Tags]:
    text = report.render(FILES, MANIFEST)
    tags = Tags()
    tags.feed(text)
    return text, tags


def test_the_page_shows_checks_with_fixes_nodes_nics_events_logs_and_what_is_missing() -> None:
    text, _ = page()
    for shown in ("the driver container crashes", "kubectl logs &lt;pod&gt; -c mofed",
                  "Checks: 1 failed, 0 warnings, 1 passed", "ens1f0np0 0000:08:00.0 101d ETH "
                  "VFs 8/16", "CrashLoopBackOff", "upgrade-failed", "nvidia.com/rdma: 63/63, 1 "
                  "in use", "DriverFailed", "log of x", "403 Forbidden",
                  "mofed-ds-abc/mofed (last 3 lines, 1 with errors)"):
        assert shown in text, shown
    assert '<mark class="err">ERROR: modprobe mlx5_core failed</mark>' in text
    assert text.index("the driver container crashes") < text.index("all good")  # fails first


def test_nothing_in_the_page_is_fetched_and_cluster_text_never_runs() -> None:
    text, tags = page()
    assert [t for t, _ in tags.tags if t in ("img", "link", "iframe", "object")] == []
    assert [t for t, a in tags.tags if t == "script" and a.get("src")] == []
    assert len([t for t, _ in tags.tags if t == "script"]) == 1  # nicop's own, inline
    assert "default-src 'none'" in text
    assert "&lt;script&gt;x()&lt;/script&gt;" in text and "<script>x()" not in text
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)
