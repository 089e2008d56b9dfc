"""nicop-sim's commands on the `nicop` command (entry point group `nicop.cli`): the local
cluster (`nicop cluster`), the demo, and the simulated nodes (`sim-node`, `sim-kubelet`,
`sim-host`)."""

from nicop_sim import cluster_cli, node_cli  # noqa: F401
