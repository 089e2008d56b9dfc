"""`kubectl nicop`: the readers as a kubectl plugin.

kubectl runs any `kubectl-<name>` executable on PATH as `kubectl <name>`, passing the rest of the
command line unchanged; the package installs `kubectl-nicop`. Its commands are nicop's own
`status`, `diagnose`, `plan`, `bundle` and `upgrade retry`, with kubectl's flags: --kubeconfig (or
$KUBECONFIG), --context, -n for the operator's namespace, -o json|yaml|wide, and exit 1 when
something failed.
"""

from __future__ import annotations

import typer

from nicop.cli import bundle, inspect, plan, upgrade

EXAMPLES = """\
Examples:

  # Everything nicop runs, node by node
  kubectl nicop status
  # The same as JSON for scripts (docs/status-schema.json), from another context
  kubectl nicop status -o json --context prod
  # A picture of the control loop, coloured by readiness (.svg, or .dot for Graphviz)
  kubectl nicop status --graph loop.svg
  # The troubleshooting checklist of the cluster; exits 1 when a check fails
  kubectl nicop diagnose
  # Why a node or a pod has no RDMA
  kubectl nicop diagnose node worker-3
  kubectl nicop diagnose pod default/trainer-0 -o yaml
  # What applying a policy change would do (nodes reloaded, pods evicted); writes nothing
  kubectl nicop plan -f nicclusterpolicy.yaml
  # A support archive, operator installed in another namespace
  kubectl nicop bundle -n network-operator -o support.tar.gz
  # A node whose driver upgrade failed, its cause fixed: retry it now
  kubectl nicop upgrade retry worker-3
"""

plugin = typer.Typer(
    name="kubectl nicop",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="nicop's status, diagnosis, plan and support bundle, as a kubectl plugin.",
    epilog=EXAMPLES,
)
plugin.command("status", epilog=EXAMPLES)(inspect.status)
plugin.command("diagnose", epilog=EXAMPLES)(inspect.diagnose)
plugin.command("plan", epilog=EXAMPLES)(plan.plan)
plugin.command("bundle", epilog=EXAMPLES)(bundle.bundle)
plugin.add_typer(upgrade.upgrade_app, name="upgrade")


def main() -> None:
    plugin(prog_name="kubectl nicop")
