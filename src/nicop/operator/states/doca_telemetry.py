"""state-doca-telemetry-service: DOCA telemetry on each node with a ready driver."""

from __future__ import annotations

from nicop.api.mellanox import DOCATelemetryServiceSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    AFTER_DRIVER,
    Context,
    RenderError,
    State,
    config_map,
    container,
    daemonset,
    image,
    typed,
)

DEFAULT_CONFIG_MAP = "doca-telemetry-service"


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    spec = typed(DOCATelemetryServiceSpec, section, path)
    from_config_map = spec.config.from_config_map if spec.config else None
    objects = []
    if from_config_map is None:
        objects.append(config_map(ctx, DEFAULT_CONFIG_MAP, {
            "DTS_CONFIG_DIR": "/config", "DTS_IMAGE_TAG": spec.version or ""}))
        source = DEFAULT_CONFIG_MAP
    elif not from_config_map:
        raise RenderError(f"{path}.config.fromConfigMap", "must name a ConfigMap")
    else:
        source = from_config_map
    objects.append(daemonset(
        ctx, "doca-telemetry-service", spec,
        [container("doca-telemetry-service", image(ctx, spec, path), spec,
                   envFrom=[{"configMapRef": {"name": source}}])],
        app="doca-telemetry-service", node_selector=AFTER_DRIVER,
        selector={"app.kubernetes.io/name": "doca-telemetry"},
    ))
    return objects


STATE = State("state-doca-telemetry-service", ("docaTelemetryService",),
              "DOCATelemetryServiceReady", render)
