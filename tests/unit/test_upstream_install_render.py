"""nicop renders, for the policy of a real upstream install, what upstream's operator created:
the same objects by kind and name, the same immutable selectors, and pod templates that run the
same (tests/data/upstream-install, read from a cluster upstream's operator managed). So taking
that install over replaces no pod; the takeover test proves it through the API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.api_defaults import differences, without_defaults

from nicop.api.kinds import KINDS
from nicop.operator.states import STATES
from nicop.operator.states.base import Context
from nicop.operator.templates import substance, what_runs
from nicop_sim import hardware

Obj = dict[str, Any]
INSTALL = Path(__file__).parent.parent / "data" / "upstream-install"
NAMESPACE = "nvidia-network-operator"
INIT_IMAGE = ("nvcr.io/nvstaging/mellanox/network-operator-init-container:"
              "network-operator-v26.7.0-rc.1")


def upstream_objects() -> dict[tuple[str, str], Obj]:
    objects = (yaml.safe_load(p.read_text()) for p in sorted((INSTALL / "objects").iterdir()))
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def rendered() -> dict[tuple[str, str], Obj]:
    """nicop's objects for the install's policy on its nodes (the profiles it ran on)."""
    policy = yaml.safe_load((INSTALL / "nicclusterpolicy.yaml").read_text())
    policy["metadata"]["uid"] = "uid"
    nodes = [{"metadata": {"name": f"node-{i}", "labels": hardware.PROFILES[p].node_labels()}}
             for i, p in enumerate(("cx6dx", "dgx", "cx6dx"))]
    ctx = Context(policy, NAMESPACE, managed_nodes=nodes, ofed_init_image=INIT_IMAGE)
    out = {}
    for state in STATES:
        if (section := state.section_of(policy)) is not None:
            for obj in state.render(ctx, section, state.path):
                out[obj["kind"], obj["metadata"]["name"]] = obj
    return out


UPSTREAM = upstream_objects()
WORKLOADS = sorted(k for k in UPSTREAM if k[0] in ("DaemonSet", "Deployment"))


def test_nicop_renders_every_object_upstream_created_but_its_own_crds() -> None:
    """The nv-ipam CRDs are nicop's own (installed with its CRDs, not by a state)."""
    own_crds = {("CustomResourceDefinition", m.crd.name) for m in KINDS}
    missing = set(UPSTREAM) - set(rendered()) - own_crds
    assert not missing
    assert {k for k in UPSTREAM if k[0] == "CustomResourceDefinition"} <= own_crds


@pytest.mark.parametrize("key", WORKLOADS, ids=lambda k: k[1])
def test_a_workload_runs_as_upstream_s_with_its_selector(key: tuple[str, str]) -> None:
    ours, theirs = rendered()[key], UPSTREAM[key]
    assert ours["spec"]["selector"] == theirs["spec"]["selector"]
    assert not differences(substance(without_defaults(ours["spec"]["template"])),
                           substance(without_defaults(theirs["spec"]["template"])))


@pytest.mark.parametrize("key", [k for k in WORKLOADS if k[1].startswith("mofed-")],
                         ids=lambda k: k[1])
def test_the_driver_runs_what_upstream_s_runs(key: tuple[str, str]) -> None:
    """The policy's env first, upstream's defaults after it, in both containers; the policy's
    nodeAffinity in place of the one-driver-per-node anti-affinity, as upstream renders it."""
    template = rendered()[key]["spec"]["template"]
    assert what_runs(without_defaults(template)) == what_runs(
        without_defaults(UPSTREAM[key]["spec"]["template"]))
    env = [e["name"] for e in template["spec"]["containers"][0]["env"]]
    assert env == ["UNLOAD_STORAGE_MODULES", "RESTORE_DRIVER_ON_POD_TERMINATION",
                   "CREATE_IFNAMES_UDEV", "NVIDIA_NIC_DRIVERS_INVENTORY_PATH"]
    assert set(template["spec"]["affinity"]) == {"nodeAffinity"}
