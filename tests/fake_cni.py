"""A stand-in CNI plugin executable for meta-plugin tests: it records each call and answers.

Every call appends one JSON line to $FAKE_CNI_LOG: the plugin's name, CNI_COMMAND, CNI_IFNAME,
CNI_ARGS, CNI_PATH, CNI_NETNS and the config it got on stdin. ADD prints a result for the
config's version: its `prevResult` when it has one (a later plugin of a list), with `addDns`
adding a nameserver; else one interface (the runtime's ifname in the netns, the MAC of
runtimeConfig.mac or `mac`) with the config's `address`. A command named in the config's
`fail` ({"ADD": "message"}) fails with code 7 and that message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SCRIPT = '''
import json, os, sys

config = json.loads(sys.stdin.read() or "{}")
command = os.environ.get("CNI_COMMAND", "")
log = os.environ.get("FAKE_CNI_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps({
            "plugin": os.path.basename(sys.argv[0]), "command": command,
            "ifname": os.environ.get("CNI_IFNAME", ""), "args": os.environ.get("CNI_ARGS", ""),
            "path": os.environ.get("CNI_PATH", ""), "netns": os.environ.get("CNI_NETNS", ""),
            "config": config}) + "\\n")
version = config.get("cniVersion") or "0.1.0"
fail = config.get("fail") or {}
if command in fail:
    print(json.dumps({"cniVersion": version, "code": 7, "msg": fail[command],
                      "details": "from the fake plugin"}))
    sys.exit(1)
if command == "ADD":
    prev = config.get("prevResult")
    if prev:
        result = dict(prev)
        if config.get("addDns"):
            result["dns"] = {"nameservers": ["10.0.0.53"]}
    else:
        mac = (config.get("runtimeConfig") or {}).get("mac") or config.get("mac") \\
            or "02:00:00:00:00:01"
        result = {"cniVersion": version,
                  "interfaces": [{"name": os.environ["CNI_IFNAME"], "mac": mac,
                                  "sandbox": os.environ.get("CNI_NETNS", "")}],
                  "ips": [{"address": config.get("address", "10.0.0.2/24"), "interface": 0}]}
    result["cniVersion"] = version
    print(json.dumps(result))
'''


def install_fake(bin_dir: Path, python: str, *names: str) -> None:
    """The fake plugin in `bin_dir` under each of `names`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(f"#!{python}\n{SCRIPT}")
        os.chmod(path, 0o755)


def calls(log: Path) -> list[dict[str, Any]]:
    """What the fake plugins recorded, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
