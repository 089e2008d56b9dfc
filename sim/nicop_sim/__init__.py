"""Stand-ins for what a development machine lacks: the control plane, nodes and NIC hardware."""
