"""The device plugins' Prometheus metrics, one series per resource (`resource` is the full
extended resource name, e.g. `rdma/rdma_shared_device_a`, `nvidia.com/cx6dx_vf`).

The kubelet tells a plugin when it hands devices out (Allocate) but never when a pod gives them
back, so `nicop_device_plugin_devices_allocated` counts the devices Allocate has handed out since
the plugin started that the plugin still advertises; a device of a pod that has ended counts
until the kubelet hands it out again or the plugin restarts. The help text says so.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

DEVICES = Gauge("nicop_device_plugin_devices", "Devices advertised to the kubelet", ["resource"])
HEALTHY = Gauge("nicop_device_plugin_devices_healthy",
                "Devices advertised to the kubelet as Healthy", ["resource"])
ALLOCATED = Gauge(
    "nicop_device_plugin_devices_allocated",
    "Advertised devices handed out by Allocate since the plugin started (the kubelet does not "
    "tell a plugin when a pod gives a device back: a device of an ended pod counts until the "
    "plugin restarts)", ["resource"])
ALLOCATE_SECONDS = Histogram(
    "nicop_device_plugin_allocate_seconds", "Duration of the kubelet's Allocate calls",
    ["resource"], buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
REGISTRATIONS = Counter("nicop_device_plugin_registrations",
                        "Registrations with the kubelet (again after a kubelet restart)",
                        ["resource"])
REGISTERED = Gauge("nicop_device_plugin_registered",
                   "1 while the resource is registered with the kubelet, else 0", ["resource"])

PER_RESOURCE = (DEVICES, HEALTHY, ALLOCATED, ALLOCATE_SECONDS, REGISTRATIONS, REGISTERED)


def forget(resource: str) -> None:
    """Drop a resource's series (it is no longer configured on this node)."""
    for metric in PER_RESOURCE:
        with contextlib.suppress(KeyError):
            metric.remove(resource)
