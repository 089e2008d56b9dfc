"""`nicop discover`: the cluster's NICs and a policy that selects them (nicop.discover)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import Kubeconfig, KubeContext, app, console, err, fail_plain
from nicop.cli.inspect import OperatorNamespace

DISCOVER_EXAMPLES = """\
Examples:

  # The NICs of every node and a NicClusterPolicy that selects them, with why
  nicop discover > policy.yaml
  # ... and an SR-IOV node policy with 8 VFs per port for each SR-IOV capable NIC model
  nicop discover --vfs 8
  # Plan the suggestion against the cluster, and apply it if nothing is disruptive
  nicop discover --apply
"""


@app.command("discover", epilog=DISCOVER_EXAMPLES)
def discover(
    vfs: Annotated[int, typer.Option("--vfs", min=0, help="Also suggest an SR-IOV node policy "
                                     "with this many VFs per port for each capable model.")] = 0,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE",
                                  help="Write the suggestion here instead of standard output.")
    ] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Plan the suggestion (as `nicop plan`) "
                                        "and apply it when nothing in it is disruptive.")
                     ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="With --apply: apply also what is "
                                      "disruptive.")] = False,
    image: Annotated[
        str | None, typer.Option("--image", envvar="NICOP_IMAGE",
                                 help="nicop's image, for the discovery pods of nodes no agent "
                                 "reports yet; default the one matching this nicop.")
    ] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for discovery pods.")
                       ] = 120.0,
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Find every node's Mellanox NICs (from the SR-IOV config daemons' and DRA plugins'
    reports, else a short-lived discovery pod on the node) and suggest a NicClusterPolicy that
    selects exactly them: the running one where it already does, with each model it misses
    added. Every choice is a comment in the YAML. Exit 0; 1 on an error; with --apply, 2 when
    the plan is disruptive and --yes is not given."""

    from nicop import discover as discover_module
    from nicop import plan as plan_module
    from nicop.api.agents import own_image
    from nicop.kube.client import ApiClient
    from nicop.kube.resources import NIC_CLUSTER_POLICY
    from nicop.status import ClusterReadError, read_cluster

    def progress(line: str) -> None:
        err.print(line, markup=False, highlight=False)

    async def run(client: ApiClient) -> dict[str, object]:
        found = await discover_module.find(client, namespace, image or own_image(), progress,
                                           timeout)
        live = await client.get_or_none(NIC_CLUSTER_POLICY, "nic-cluster-policy")
        suggestion = discover_module.suggest(found, live, namespace, vfs)
        result: dict[str, object] = {"suggestion": suggestion}
        if apply:
            objects = [suggestion.policy, *suggestion.sriov]
            planned = await plan_module.plan(client, objects, namespace)
            result["plan"] = planned
            if planned.exit_code() == 0 or (planned.exit_code() == 2 and yes):
                await plan_module.apply(client, objects)
                result["applied"] = True
        return result

    try:
        result = read_cluster(kubeconfig, run, context)
    except ClusterReadError as e:
        raise fail_plain(f"cannot read the cluster: {e}") from None
    suggestion: discover_module.Suggestion = result["suggestion"]
    text = suggestion.yaml()
    if output is not None:
        output.write_text(text)
        progress(f"wrote the suggestion to {output}")
    elif not apply:
        print(text, end="")
    if not apply:
        return
    planned: plan_module.Plan = result["plan"]
    for line in plan_module.text(planned):
        console.print(line, markup=False)
    if result.get("applied"):
        console.print("applied", markup=False)
        return
    if planned.exit_code() == 2:
        progress("not applied: the plan is disruptive; run again with --yes to apply it")
    raise typer.Exit(planned.exit_code())
