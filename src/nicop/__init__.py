"""nicop: RDMA and SR-IOV networking for Kubernetes, one declarative policy at a time."""

__version__ = "0.1.0"
