"""CNI plugins for pod attachment: `sriov`, `ib-sriov`, `host-device` and the `nv-ipam` IPAM.

The container runtime executes a tiny stdlib-only shim (`shim.py`, installed under each plugin's
name); the shim forwards the request over a unix socket to `nicop cni-daemon`, which does the
netlink and IPAM work (`daemon.py`). The daemon keeps what DEL needs under /var/lib/cni of the
node's `Host` root, in the same places and formats as the upstream plugins.
"""
