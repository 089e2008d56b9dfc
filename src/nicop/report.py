"""The bundle as one HTML page a person reads away from the cluster.

Made from the bundle's own files after they were scrubbed (so it holds nothing the archive does
not), and self-contained: styles and the little script are inline, and the page's Content
Security Policy forbids every fetch, so opening it reaches no network. It shows the diagnose
checks with their fixes first (failures on top), then the policy and its components, the
driver upgrade, every node with its NICs, driver, upgrade state and resources, an events
timeline, each container's last log lines with errors marked, and what was not collected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from html import escape
from typing import Any

import yaml

LOG_TAIL = 200  # lines of each log shown; the archive has them all
ERROR_LINE = re.compile(r"\b(error|fail(ed|ure)?|panic|traceback|exception|fatal|refused)\b",
                        re.IGNORECASE)
RESULT_ORDER = {"fail": 0, "warn": 1, "pass": 2}

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:16px 24px}header h1{margin:0 0 4px;font-size:20px}
header p{margin:0;color:#c9d1e0}nav{padding:8px 24px;background:#e9edf3}
nav a{margin-right:16px;color:#1d4ed8;text-decoration:none}
section{margin:16px 24px;padding:12px 16px;background:#fff;border:1px solid #dde2ea;
border-radius:6px}h2{font-size:16px;margin:4px 0 10px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;vertical-align:top;
padding:4px 8px;border-bottom:1px solid #eef0f4}th{background:#f0f2f6}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}
pre{background:#0f1420;color:#dfe6f3;padding:8px;overflow-x:auto;max-height:420px}
mark.err{background:#7f1d1d;color:#fff}.badge{padding:1px 8px;border-radius:9px;
font-weight:600;font-size:12px}.fail{background:#fde2e2;color:#991b1b}
.warn{background:#fef3c7;color:#92400e}.pass{background:#dcfce7;color:#166534}
tr.Warning td{background:#fffbeb}.muted{color:#6b7280}
input[type=search]{padding:4px 8px;width:260px}
"""

SCRIPT = """
document.getElementById('show-passed').addEventListener('change', function (e) {
  document.querySelectorAll('tr.check-pass').forEach(function (row) {
    row.hidden = !e.target.checked;
  });
});
document.getElementById('node-filter').addEventListener('input', function (e) {
  var text = e.target.value.toLowerCase();
  document.querySelectorAll('#nodes tbody tr').forEach(function (row) {
    row.hidden = text !== '' && row.textContent.toLowerCase().indexOf(text) < 0;
  });
});
"""

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")


def render(files: Mapping[str, str], manifest: Mapping[str, Any]) -> str:
    """The page, from the bundle's scrubbed files by path and its manifest."""
    status = _json(files.get("status.json"))
    diagnose = _json(files.get("diagnose.json"))
    namespace = str(manifest.get("namespace", ""))
    version = (_json(files.get("cluster/version.json")) or {}).get("gitVersion", "unknown")
    title = f"nicop bundle {manifest.get('createdAt', '')}"
    body = [
        f"<header><h1>{escape(title)}</h1><p>nicop {escape(str(manifest.get('nicopVersion')))}"
        f" &middot; Kubernetes {escape(str(version))} &middot; operator namespace "
        f"{escape(namespace)}</p></header>",
        '<nav><a href="#checks">Checks</a><a href="#policy">Policy</a><a href="#nodes">Nodes'
        '</a><a href="#events">Events</a><a href="#logs">Logs</a><a href="#missing">Not '
        "collected</a></nav>",
        _checks(diagnose),
        _policy(status),
        _nodes(status, _node_states(files)),
        _events(files, namespace),
        _logs(files),
        _missing(manifest),
    ]
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            + "".join(body) + f"<script>{SCRIPT}</script></body></html>\n")


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _yaml_list(text: str | None) -> list[Any]:
    if not text:
        return []
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    return value if isinstance(value, list) else []


def _table(head: list[str], rows: list[str], body_id: str = "") -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    attr = f' id="{body_id}"' if body_id else ""
    return f"<table{attr}><thead><tr>{cells}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _checks(diagnose: Any) -> str:
    if not isinstance(diagnose, dict):
        return '<section id="checks"><h2>Checks</h2><p>diagnose.json is missing.</p></section>'
    checks = sorted(diagnose.get("checks") or [],
                    key=lambda c: RESULT_ORDER.get(c.get("result"), 3))
    counts = diagnose.get("summary") or {}
    rows = []
    for c in checks:
        result = str(c.get("result"))
        fix = f"<code>{escape(str(c['fix']))}</code>" if c.get("fix") else ""
        hidden = " hidden" if result == "pass" else ""
        rows.append(f'<tr class="check-{escape(result)}"{hidden}><td><span class="badge '
                    f'{escape(result)}">{escape(result)}</span></td>'
                    f"<td>{escape(str(c.get('subject')))}</td><td>{escape(str(c.get('name')))}"
                    f"</td><td>{escape(str(c.get('message')))}</td><td>{fix}</td></tr>")
    heading = (f"Checks: {counts.get('fail', 0)} failed, {counts.get('warn', 0)} warnings, "
               f"{counts.get('pass', 0)} passed")
    return (f'<section id="checks"><h2>{escape(heading)}</h2><label><input type="checkbox" '
            'id="show-passed"> show passed checks</label>'
            + _table(["result", "subject", "check", "what is wrong", "fix"], rows)
            + "</section>")


def _policy(status: Any) -> str:
    policy = (status or {}).get("policy")
    if not policy:
        return '<section id="policy"><h2>Policy</h2><p>No NicClusterPolicy.</p></section>'
    rows = [f"<tr><td>{escape(str(c.get('name')))}</td><td><span class=\"badge "
            f"{_tone(c.get('state'))}\">{escape(str(c.get('state')))}</span></td>"
            f"<td>{escape(str(c.get('message') or ''))}</td></tr>"
            for c in policy.get("components") or []]
    upgrade = (status or {}).get("driverUpgrade")
    upgrade_line = ""
    if upgrade:
        upgrade_line = (f"<p>Driver upgrade: {upgrade.get('done', 0)} done, "
                        f"{upgrade.get('inProgress', 0)} in progress, "
                        f"{upgrade.get('waiting', 0)} waiting, {upgrade.get('failed', 0)} "
                        f"failed {escape(', '.join(upgrade.get('failedNodes') or []))}</p>")
    return (f'<section id="policy"><h2>Policy {escape(str(policy.get("name")))}: '
            f"{escape(str(policy.get('state')))}</h2>"
            f"<p>{escape(str(policy.get('message') or ''))}</p>{upgrade_line}"
            + _table(["component", "state", "message"], rows) + "</section>")


def _tone(state: Any) -> str:
    return {"ready": "pass", "ignore": "pass", "notReady": "warn"}.get(str(state), "fail")


def _node_states(files: Mapping[str, str]) -> dict[str, list[Any]]:
    """Each node's NICs as its SR-IOV config daemon reported them."""
    states = _yaml_list(files.get("resources/sriovnetworknodestates.sriovnetwork.openshift.io"
                                  ".yaml"))
    return {str((s.get("metadata") or {}).get("name")): (s.get("status") or {}).get(
        "interfaces") or [] for s in states if isinstance(s, dict)}


def _nodes(status: Any, nics: Mapping[str, list[Any]]) -> str:
    rows = []
    for node in (status or {}).get("nodes") or []:
        name = str(node.get("name"))
        managed = "yes" if node.get("managed") else escape(
            "no" + (f": {node['unmanagedReason']}" if node.get("unmanagedReason") else ""))
        driver = node.get("driver") or {}
        driver_text = escape(" ".join(str(x) for x in (
            driver.get("version") or "", "ready" if driver.get("ready") else "not ready",
            driver.get("problem") or "") if x)) if driver else '<span class="muted">none</span>'
        resources = "<br>".join(
            escape(f"{r.get('name')}: {r.get('allocatable')}/{r.get('capacity')}"
                   + (f", {r['inUse']} in use" if r.get("inUse") is not None else ""))
            for r in node.get("resources") or [])
        nic_text = "<br>".join(
            escape(f"{i.get('name')} {i.get('pciAddress')} {i.get('deviceID', '')} "
                   f"{i.get('linkType', '')} VFs {i.get('numVfs', 0)}/{i.get('totalvfs', '?')}")
            for i in nics.get(name, []))
        sriov = node.get("sriov") or {}
        if sriov:
            nic_text += ("<br>" if nic_text else "") + escape(
                f"SR-IOV {sriov.get('syncStatus')}: {sriov.get('vfsConfigured')}/"
                f"{sriov.get('vfsWanted')} VFs" + (f" ({sriov['lastSyncError']})"
                                                   if sriov.get("lastSyncError") else ""))
        upgrade = escape(str(node.get("upgradeState") or "")) + (
            f"<br>{escape(str(node['drainBlocked']))}" if node.get("drainBlocked") else "")
        ready = "Ready" if node.get("ready") else "NotReady"
        rows.append(f"<tr><td>{escape(name)}</td><td>{ready}</td><td>{managed}</td>"
                    f"<td>{nic_text}</td><td>{driver_text}</td><td>{upgrade}</td>"
                    f"<td>{resources}</td></tr>")
    return ('<section id="nodes"><h2>Nodes</h2><p><input id="node-filter" type="search" '
            'placeholder="filter nodes" aria-label="filter nodes"></p>'
            + _table(["node", "ready", "managed", "NICs", "driver", "upgrade", "resources"],
                     rows) + "</section>")


def _events(files: Mapping[str, str], namespace: str) -> str:
    events = [e for e in _yaml_list(files.get(f"namespaces/{namespace}/events.yaml"))
              + _yaml_list(files.get("nodes/events.yaml")) if isinstance(e, dict)]

    def when(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or
                   (e.get("metadata") or {}).get("creationTimestamp") or "")

    rows = []
    for e in sorted(events, key=when):
        involved = e.get("involvedObject") or {}
        what = f"{involved.get('kind', '')} {involved.get('name', '')}"
        kind = "Warning" if e.get("type") == "Warning" else "Normal"
        rows.append(f'<tr class="{kind}"><td>{escape(when(e))}</td><td>{kind}</td>'
                    f"<td>{escape(what)}</td><td>{escape(str(e.get('reason', '')))}</td>"
                    f"<td>{escape(str(e.get('message', '')))}</td></tr>")
    return ('<section id="events"><h2>Events</h2>'
            + _table(["time", "type", "object", "reason", "message"], rows) + "</section>")


def _logs(files: Mapping[str, str]) -> str:
    parts = []
    for path in sorted(p for p in files if p.startswith("logs/")):
        lines = files[path].splitlines()[-LOG_TAIL:]
        errors = sum(bool(ERROR_LINE.search(line)) for line in lines)
        shown = "\n".join(f'<mark class="err">{escape(line)}</mark>'
                          if ERROR_LINE.search(line) else escape(line) for line in lines)
        name = path.removeprefix("logs/").removesuffix(".log")
        note = f", {errors} with errors" if errors else ""
        parts.append(f"<details{' open' if errors else ''}><summary>{escape(name)} "
                     f"(last {len(lines)} lines{note})</summary><pre>{shown}</pre></details>")
    return ('<section id="logs"><h2>Logs</h2>' + ("".join(parts) or "<p>No log collected.</p>")
            + "</section>")


def _missing(manifest: Mapping[str, Any]) -> str:
    rows = [f"<tr><td>{escape(str(m.get('item')))}</td><td>{escape(str(m.get('reason')))}</td>"
            "</tr>" for m in manifest.get("notCollected") or []]
    return ('<section id="missing"><h2>Not collected</h2>'
            + _table(["item", "why"], rows) + "</section>")
