"""`nicop operator` and `nicop crds`: the cluster-scope process and the CRDs it serves."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import Kubeconfig, app, console, err, fail


@app.command("operator")
def operator(
    namespace: Annotated[
        str,
        typer.Option(envvar="POD_NAMESPACE", help="Namespace of the operator and its components."),
    ] = "nvidia-network-operator",
    kubeconfig: Kubeconfig = None,
    leader_elect: Annotated[
        bool, typer.Option(help="Run only while holding the leader Lease.")
    ] = True,
    health_port: Annotated[
        int, typer.Option(help="Port of /healthz, /readyz, /metrics; 0: off.")
    ] = 8081,
    lease_duration: Annotated[float, typer.Option(help="Leader lease duration in seconds.")] = 15.0,
    log_format: Annotated[str, typer.Option(help="text or json (one object per line).")] = "text",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the operator: NicClusterPolicy and network controllers, leader-elected."""
    from nicop import logs
    from nicop.operator import run

    logs.setup(log_level, log_format)
    with contextlib.suppress(KeyboardInterrupt):
        run.main(namespace, kubeconfig, leader_elect, health_port, lease_duration)



# --- crds: the CustomResourceDefinitions generated from nicop.api -----------------------------

crds_app = typer.Typer(
    no_args_is_help=True,
    help="The CRDs of every kind nicop reads, generated from its API models.",
)
app.add_typer(crds_app, name="crds")


@crds_app.command("generate")
def crds_generate(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Directory of the CRD files.")] = Path(
        "deploy/crds"
    ),
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file is out of date.")
    ] = False,
) -> None:
    """Write one CRD file per kind (<group>_<plural>.yaml) from the models."""
    from nicop.api import crdgen

    if check:
        problems = crdgen.stale(out_dir)
        for line in problems:
            err.print(f"  {line}")
        if problems:
            raise fail("CRD files are out of date; run `nicop crds generate`")
        console.print(f"CRD files in {out_dir} are up to date.")
        return
    changed = crdgen.generate(out_dir)
    for path in changed:
        console.print(f"  wrote {path}")
    console.print(f"{len(changed)} of the CRD files in {out_dir} changed.")


@crds_app.command("install")
def crds_install(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBECONFIG", help="Kubeconfig of the cluster (default ~/.kube/config)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each CRD.")] = 60.0,
) -> None:
    """Apply the CRDs to the cluster and wait until the API server serves them."""
    from nicop.kube.client import ApiError
    from nicop.kube.kubeconfig import KubeconfigError
    from nicop.operator.crds import CrdInstallError, install_crds

    try:
        names = install_crds(
            kubeconfig, progress=lambda line: console.print(f"  {line}"), timeout=timeout
        )
    except (CrdInstallError, ApiError, KubeconfigError, OSError) as e:
        raise fail(str(e)) from None
    console.print(f"{len(names)} CRDs installed and established.")
