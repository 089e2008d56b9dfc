"""The `nicop` command (its console script and `python -m nicop`).

`nicop probe-ready` and `nicop driver probe KIND` are answered before the command line is parsed:
exec probes run them every few seconds in every agent and driver container, so they must not pay
for importing the whole CLI (about 0.25 s of CPU a run against 0.03 s: on a node with seven
agents that was a sixth of a core at rest; and a probe that outlives its timeout on a busy node
marks the driver not ready, so every component that waits for the driver leaves the node).
"""

import sys


def main() -> None:
    if sys.argv[1:] == ["probe-ready"]:
        from nicop.node.readiness import probe

        ok, reason = probe()
        print(reason)
        sys.exit(0 if ok else 1)

    if len(sys.argv) == 4 and sys.argv[1:3] == ["driver", "probe"]:
        import os
        from pathlib import Path

        from nicop.node.kernel import PROBE_KINDS, probe_from_env
        from nicop.platform import current

        if sys.argv[3] in PROBE_KINDS:
            host = current().host(Path(os.environ.get("NICOP_HOST_ROOT") or "/"))
            ok, reason = probe_from_env(sys.argv[3], host)
            print(reason)
            sys.exit(0 if ok else 1)

    from nicop.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
