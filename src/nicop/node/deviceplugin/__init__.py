"""Kubelet device plugins: the v1beta1 gRPC API, a server for one resource, and the RDMA shared
and SR-IOV plugins built on it."""

import os

# gRPC's C core would log every connection teardown (a kubelet restart, a plugin stopping) to
# stderr; the agents log what matters themselves. Read once, when grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
