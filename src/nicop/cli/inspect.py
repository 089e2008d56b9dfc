"""`nicop status` and `nicop diagnose`: what the stack is doing, and what is wrong with it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nicop.cli.common import Kubeconfig, KubeContext, app, console, err, fail, fail_plain

OutputFormat = Annotated[
    str, typer.Option("--output", "-o",
                      help="table (for people; wide: never cut to the terminal), json or yaml "
                      "(for scripts).")
]
OUTPUTS = ("table", "wide", "json", "yaml")
OperatorNamespace = Annotated[
    str,
    typer.Option("--namespace", "-n", envvar="POD_NAMESPACE",
                 help="Namespace of the operator and its components."),
]


def _print_data(data: object, output: str) -> None:
    import json

    import yaml

    if output == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")


STATUS_EXAMPLES = """\
Examples:

  # Everything nicop runs, node by node
  nicop status
  # The same, and a picture of the control loop (policy, components, DaemonSets, nodes)
  nicop status --graph loop.svg
  # The picture as Graphviz dot, to lay out with `dot -Tpng loop.dot -o loop.png`
  nicop status --graph loop.dot
"""


@app.command("status", epilog=STATUS_EXAMPLES)
def status(
    output: OutputFormat = "table",
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep refreshing the tables.")
    ] = False,
    graph: Annotated[
        Path | None,
        typer.Option("--graph", metavar="FILE",
                     help="Also write a picture of the control loop (policies, components, "
                     "their DaemonSets and Deployments, nodes; coloured by readiness) to FILE: "
                     ".svg for SVG, .dot or .gv for Graphviz dot."),
    ] = None,
    interval: Annotated[
        float, typer.Option(min=0.5, help="Seconds between refreshes with --watch.")
    ] = 2.0,
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Operator and leader, policy components, every node's driver, resources and VFs, IPAM
    pools and driver upgrade progress (-o json follows docs/status-schema.json)."""
    from nicop import status as status_module
    from nicop import status_graph

    if output not in OUTPUTS:
        raise fail(f"--output must be table, wide, json or yaml, not {output!r}")
    if watch and output not in ("table", "wide"):
        raise fail("--watch refreshes the tables; for scripts, run -o json repeatedly")
    if graph is not None:
        if watch:
            raise fail("--graph writes one picture; leave out --watch")
        try:
            status_graph.format_of(graph)
        except status_graph.UnknownFormat as e:
            raise fail_plain(str(e)) from None

    def read() -> dict[str, object]:
        try:
            snap = status_module.read_cluster(
                kubeconfig, lambda client: status_module.collect(
                    client, namespace, graph=graph is not None), context)
        except status_module.ClusterReadError as e:
            raise fail_plain(str(e)) from None
        summary = status_module.summarize(snap)
        if graph is not None:
            try:
                status_graph.write(status_graph.build(snap, summary), graph)
            except OSError as e:
                raise fail_plain(f"cannot write the graph to {graph}: {e}") from None
            err.print(f"wrote the control loop to {graph}", markup=False, highlight=False)
        return summary

    if not watch:
        summary = read()
        if output in ("table", "wide"):
            # Piped into a file or a pager, or -o wide: as wide as the tables need.
            out = console if console.is_terminal and output == "table" else Console(
                width=max(console.width, 240), highlight=False, soft_wrap=True)
            out.print(status_module.render(summary))
        else:
            _print_data(summary, output)
        return
    import time

    from rich.console import RenderableType
    from rich.live import Live
    from rich.text import Text

    def view() -> RenderableType:
        """The tables, or why the cluster could not be read this time (the watch goes on)."""
        try:
            snap = status_module.read_cluster(
                kubeconfig, lambda client: status_module.collect(client, namespace), context)
        except status_module.ClusterReadError as e:
            return Text(f"cannot read the cluster: {e}; trying again every {interval:g}s",
                        style="red")
        return status_module.render(status_module.summarize(snap))

    with contextlib.suppress(KeyboardInterrupt), Live(
        view(), console=console, auto_refresh=False, screen=False
    ) as live:
        while True:
            time.sleep(interval)
            live.update(view(), refresh=True)


@app.command("diagnose")
def diagnose(
    kind: Annotated[
        str | None,
        typer.Argument(metavar="node|pod",
                       help="node or pod; leave out to check the whole cluster."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="NAME of the node, or NAMESPACE/NAME of the pod."),
    ] = None,
    output: OutputFormat = "table",
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Run the troubleshooting checklist on the cluster, a node or a pod; every failure names
    its cause and fix. Exits 1 when a check fails."""
    from nicop import diagnose as diagnose_module
    from nicop import status as status_module

    if output not in OUTPUTS:
        raise fail(f"--output must be table, wide, json or yaml, not {output!r}")
    try:
        target = diagnose_module.Target.parse(kind, name)
    except ValueError as e:
        raise fail(str(e)) from None
    try:
        snap = status_module.read_cluster(
            kubeconfig, lambda client: diagnose_module.collect(client, namespace, target),
            context)
    except status_module.ClusterReadError as e:
        raise fail_plain(str(e)) from None
    checks = diagnose_module.diagnose(snap, target)
    result = diagnose_module.report(snap, target, checks)
    if output in ("table", "wide"):
        out = console if console.is_terminal and output == "table" else Console(
            width=max(console.width, 240), highlight=False, soft_wrap=True)
        out.print(diagnose_module.render(result))
    else:
        _print_data(result, output)
    if diagnose_module.failed(checks):
        raise typer.Exit(1)

