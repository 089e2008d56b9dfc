"""`nicop upgrade`: a person's hand in the rolling driver upgrade."""

from __future__ import annotations

from typing import Annotated

import typer

from nicop.cli.common import Kubeconfig, KubeContext, app, console, fail_plain

upgrade_app = typer.Typer(no_args_is_help=True,
                          help="The rolling driver upgrade of a node: re-arm a failed one.")
app.add_typer(upgrade_app, name="upgrade")


@upgrade_app.command("retry")
def retry(
    node: Annotated[str, typer.Argument(help="The node in upgrade-failed.")],
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
) -> None:
    """Re-arm a node in upgrade-failed: the operator retries it at once from the step that
    failed, with its automatic retries counted anew. Fix the cause first (`nicop diagnose node
    NODE` names it)."""
    from nicop.api import upgrade
    from nicop.kube.client import ApiClient, ApiError
    from nicop.kube.resources import NODE, Obj
    from nicop.kube.times import stamp
    from nicop.status import ClusterReadError, read_cluster

    async def rearm(client: ApiClient) -> Obj:
        try:
            obj = await client.get(NODE, node)
        except ApiError as e:
            if e.code == 404:
                raise ClusterReadError(f"no node {node}") from None
            raise
        state = (obj["metadata"].get("labels") or {}).get(upgrade.STATE_LABEL)
        if state != upgrade.FAILED:
            raise ClusterReadError(f"node {node} is not in {upgrade.FAILED} (its driver upgrade "
                                   f"state: {state or 'none'}): nothing to retry")
        await client.patch(NODE, node, {"metadata": {"annotations": {
            upgrade.ATTEMPTS_ANNOTATION: None, upgrade.RETRY_AT_ANNOTATION: stamp()}}})
        return dict(obj["metadata"].get("annotations") or {})

    try:
        annotations = read_cluster(kubeconfig, rearm, context)
    except ClusterReadError as e:
        raise fail_plain(str(e)) from None
    step = annotations.get(upgrade.FAILED_IN_ANNOTATION) or upgrade.POD_RESTART
    console.print(f"node {node}: driver upgrade re-armed; the operator retries it from {step} "
                  "now (follow it with `nicop status --watch`)")
