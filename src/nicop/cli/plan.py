"""`nicop plan`: what applying a file would do (nicop.plan computes it; nothing is written)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import Kubeconfig, KubeContext, app, console, fail, fail_plain
from nicop.cli.inspect import OperatorNamespace

PLAN_EXAMPLES = """\
Examples:

  # What a new driver version would do: nodes reloaded, in which batches, pods evicted
  nicop plan -f nicclusterpolicy.yaml
  # For scripts (docs/plan-schema.json); exit 0: nothing disruptive, 2: disruptive, 1: error
  nicop plan -f policy.yaml -o json
"""


@app.command("plan", epilog=PLAN_EXAMPLES)
def plan(
    filename: Annotated[
        Path, typer.Option("--filename", "-f", metavar="FILE",
                           help="The objects as you would apply them (YAML or JSON, several "
                           "documents allowed); - reads standard input.")
    ],
    output: Annotated[
        str, typer.Option("--output", "-o", help="text (for people) or json (for scripts).")
    ] = "text",
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Before you apply: the API server's verdict on each object (a dry run), what changes in
    it, the objects the operator would create, change or delete, the pods it would restart and,
    for a new driver, which nodes reload in which batches, the pods each drain evicts and which
    a PodDisruptionBudget blocks. Nothing is written. Exit code 0: nothing disruptive; 2:
    disruptive; 1: an error, or the API server would refuse an object."""
    import json

    import yaml

    from nicop import plan as plan_module
    from nicop.status import ClusterReadError, read_cluster

    if output not in ("text", "json"):
        raise fail(f"--output must be text or json, not {output!r}")
    try:
        source = sys.stdin.read() if str(filename) == "-" else filename.read_text()
        objects = [d for d in yaml.safe_load_all(source) if d is not None]
        for obj in objects:
            plan_module.resource_for(obj)
    except (OSError, yaml.YAMLError, plan_module.PlanError) as e:
        raise fail_plain(f"{filename}: {e}") from None
    if not objects:
        raise fail_plain(f"{filename}: no object in it")

    async def compute(client: object) -> dict[str, object]:
        return {"plan": await plan_module.plan(client, objects, namespace)}  # type: ignore[arg-type]

    try:
        result: plan_module.Plan = read_cluster(kubeconfig, compute, context)["plan"]
    except ClusterReadError as e:
        raise fail_plain(f"cannot read the cluster: {e}") from None
    if output == "json":
        print(json.dumps(result.to_json(), indent=2))
    else:
        for line in plan_module.text(result):
            console.print(line, markup=False)
    raise typer.Exit(result.exit_code())
