"""`python -m nicop` runs the `nicop` command.

`nicop probe-ready` is answered before the command line is parsed: exec probes run it every few
seconds in every agent container, so it must not pay for importing the whole CLI.
"""

import sys

if sys.argv[1:] == ["probe-ready"]:
    from nicop.node.readiness import probe

    ok, reason = probe()
    print(reason)
    sys.exit(0 if ok else 1)

from nicop.cli import main

main()
