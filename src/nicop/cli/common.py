"""What every `nicop` command shares: the app, the consoles, errors, and common options."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from nicop.platform import HostPlatform

COMMAND_ENV = "NICOP_COMMAND"

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="nicop: RDMA and SR-IOV networking for Kubernetes.",
)


@app.callback()
def _name_the_command(ctx: typer.Context) -> None:
    """nicop: RDMA and SR-IOV networking for Kubernetes."""
    # The API requests' User-Agent names the command (nicop.kube.http.user_agent), so an audit
    # log tells `nicop plan` from the operator; a nicop child process names its own.
    os.environ[COMMAND_ENV] = ctx.invoked_subcommand or ""


console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> typer.Exit:
    """Print `message` as an error (rich markup allowed) and give the exit to raise."""
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(1)


def fail_plain(message: str) -> typer.Exit:
    """`fail` for messages that quote config values: brackets in them are not rich markup."""
    from rich.markup import escape

    return fail(escape(message))


StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="NICOP_CLUSTER_DIR",
        show_default="~/.local/state/nicop/cluster",
        help="Directory holding the cluster's certificates, data, logs and kubeconfig.",
    ),
]
MetricsPort = Annotated[
    int,
    typer.Option("--metrics-port", min=0,
                 help="Serve Prometheus /metrics (and /healthz, /readyz) on this port of the "
                 "pod's IP ($POD_IP, else every address); 0: off. The operator's DaemonSets "
                 "pass the port their container declares as `metrics`."),
]
HostRoot = Annotated[
    Path,
    typer.Option(
        "--host-root",
        envvar="NICOP_HOST_ROOT",
        help="Where the node's filesystem is (sysfs, /dev, /var/lib/kubelet): / on a node, "
        "a simulated node's root in tests.",
    ),
]
LogFormat = Annotated[
    str, typer.Option("--log-format", help="text, or json (one object per line).")
]
Kubeconfig = Annotated[
    Path | None,
    typer.Option(envvar="KUBECONFIG", help="Kubeconfig; ~/.kube/config or in-cluster when unset."),
]
KubeContext = Annotated[
    str | None,
    typer.Option("--context", help="The kubeconfig context to use; its current one when unset."),
]


def in_container(path: Path) -> Path:
    """A path the agent was given, where it really is (the container's mounts, $NICOP_MOUNTS)."""
    from nicop.node.host import Mounts

    return Path(Mounts.from_env().real(str(path))) if path.is_absolute() else path


def run_agent(main: object, log_format: str, log_level: str = "info",
              after_log_setup: Callable[[], None] | None = None, metrics_port: int = 0) -> None:
    """Run an agent's `main(stop)` until SIGTERM; exit 1 with the reason if it must give up.
    `after_log_setup` adds to the logging (a log file) once it is set up; with `metrics_port`
    the agent serves /metrics there."""
    from nicop.node import agent

    reason = agent.run_process(main, log_format, log_level,  # type: ignore[arg-type]
                               after_log_setup, metrics_port)
    if reason:
        raise fail_plain(reason)


def platform() -> HostPlatform:
    """The machine this agent works on ($NICOP_PLATFORM); a CLI error when not installed."""
    from nicop.platform import PlatformError, current

    try:
        return current()
    except PlatformError as e:
        raise fail_plain(str(e)) from None
