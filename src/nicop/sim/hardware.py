"""Hardware profiles of simulated nodes: which NICs a node has, and what OS it runs.

A profile decides the labels Node Feature Discovery would put on the node (OS, kernel, and
`pci-15b3.present` when a Mellanox NIC is present). Device IDs are the PCI IDs of the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MELLANOX_VENDOR = "15b3"
NFD_PREFIX = "feature.node.kubernetes.io"
MELLANOX_PRESENT_LABEL = f"{NFD_PREFIX}/pci-{MELLANOX_VENDOR}.present"


@dataclass(frozen=True)
class Nic:
    """One physical NIC (all its ports share the PCI device ID)."""

    model: str
    device_id: str
    ports: int
    link_type: str  # "eth" or "ib"
    numa_node: int = 0
    vendor_id: str = MELLANOX_VENDOR


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    nics: tuple[Nic, ...]
    os_id: str = "ubuntu"
    os_version: str = "22.04"
    kernel: str = "5.15.0-122-generic"
    # False reproduces a node whose NIC Node Feature Discovery has not labelled (yet).
    nfd_labelled: bool = True
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def has_mellanox_nic(self) -> bool:
        return any(n.vendor_id == MELLANOX_VENDOR for n in self.nics)

    def node_labels(self) -> dict[str, str]:
        """The labels NFD (and kubelet) would put on a node with this hardware."""
        labels = {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            f"{NFD_PREFIX}/system-os_release.ID": self.os_id,
            f"{NFD_PREFIX}/system-os_release.VERSION_ID": self.os_version,
            f"{NFD_PREFIX}/system-os_release.VERSION_ID.major": self.os_version.split(".")[0],
            f"{NFD_PREFIX}/kernel-version.full": self.kernel,
        }
        if self.has_mellanox_nic and self.nfd_labelled:
            labels[MELLANOX_PRESENT_LABEL] = "true"
        labels.update(self.extra_labels)
        return labels


CX6DX = Nic(model="ConnectX-6 Dx", device_id="101d", ports=2, link_type="eth")
CX7_IB = Nic(model="ConnectX-7", device_id="1021", ports=1, link_type="ib")
BF3 = Nic(model="BlueField-3", device_id="a2dc", ports=2, link_type="eth")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "dgx",
            "DGX-like GPU node: 8 ConnectX-7 InfiniBand NICs across 2 NUMA nodes",
            tuple(Nic(CX7_IB.model, CX7_IB.device_id, 1, "ib", numa_node=i // 4) for i in range(8)),
            os_version="22.04",
            kernel="5.15.0-122-generic",
        ),
        Profile(
            "cx6dx",
            "Ethernet GPU node: one dual-port ConnectX-6 Dx (RoCE, SR-IOV)",
            (CX6DX,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
        Profile(
            "cx7-ib",
            "InfiniBand node: one single-port ConnectX-7",
            (CX7_IB,),
            os_version="22.04",
            kernel="5.15.0-122-generic",
        ),
        Profile(
            "bf3",
            "Node with a BlueField-3 DPU in NIC mode (dual-port Ethernet)",
            (BF3,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
        Profile(
            "cx6dx-unlabelled",
            "ConnectX-6 Dx node that Node Feature Discovery has not labelled",
            (CX6DX,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
            nfd_labelled=False,
        ),
        Profile(
            "cpu",
            "CPU-only node without a Mellanox NIC",
            (),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
    )
}

# With --nodes N the local cluster cycles through this layout.
DEFAULT_LAYOUT = ("dgx", "cx6dx", "cx6dx", "cx6dx-unlabelled")


def layout(nodes: int, profiles: list[str] | None = None) -> list[Profile]:
    """The profile of each of `nodes` nodes: `profiles` (or the default layout) repeated."""
    names = profiles or list(DEFAULT_LAYOUT)
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise ValueError(
            f"unknown hardware profile {', '.join(unknown)}; known: {', '.join(PROFILES)}"
        )
    return [PROFILES[names[i % len(names)]] for i in range(nodes)]
