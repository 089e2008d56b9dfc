"""nicop's DRA driver for RDMA NICs and their VFs: the devices a node has, as ResourceSlices."""
