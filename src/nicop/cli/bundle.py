"""`nicop bundle`: the support archive (nicop.bundle says what goes in, and what never does).
nicop-sim adds `nicop bundle replay`, a local cluster shaped like a bundle's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import Kubeconfig, KubeContext, app, console, err, fail_plain
from nicop.cli.inspect import OperatorNamespace

bundle_app = typer.Typer(invoke_without_command=True)
app.add_typer(bundle_app, name="bundle")


@bundle_app.callback()
def bundle(
    ctx: typer.Context,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE.tar.gz",
                     help="Where to write the archive; default nicop-bundle-<time>.tar.gz."),
    ] = None,
    log_lines: Annotated[
        int, typer.Option("--log-lines", min=1, help="Lines of each container's log to keep.")
    ] = 5000,
    kubeconfig: Kubeconfig = None,
    context: KubeContext = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Collect what support asks for first into one archive: CRs with status, the operator's
    workloads, pods, events and logs, nodes, `status -o json`, `diagnose` and every component's
    version; and the same as one self-contained HTML page beside it (FILE with .html). Secret
    values never enter either; what cannot be read is listed in the manifest.json with the
    reason, and the rest is still collected (exit 0). Progress goes to stderr."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio

    from nicop import bundle as bundle_module
    from nicop.status import ClusterReadError, read_cluster

    path = output or Path(bundle_module.default_name())

    async def collect(client: object) -> dict[str, object]:
        collected = await bundle_module.collect(
            client, namespace, log_lines=log_lines,  # type: ignore[arg-type]
            progress=lambda line: err.print(line, markup=False, highlight=False))
        return {"bundle": collected}

    try:
        result = read_cluster(kubeconfig, collect, context)
    except ClusterReadError as e:
        raise fail_plain(f"cannot read the cluster: {e}") from None
    except asyncio.CancelledError:  # pragma: no cover - interrupted
        raise typer.Exit(130) from None
    collected: bundle_module.Bundle = result["bundle"]
    manifest = bundle_module.write(collected, str(path), namespace=namespace,
                                   log_lines=log_lines)
    for item in manifest["notCollected"]:
        err.print(f"not collected: {item['item']}: {item['reason']}", markup=False,
                  highlight=False)
    console.print(f"wrote {path} ({len(manifest['files'])} files, "
                  f"{len(manifest['notCollected'])} items not collected: see manifest.json) "
                  f"and {bundle_module.report_path(str(path))} (the same as a page to open in "
                  "a browser; it fetches nothing)", markup=False, highlight=False)
