"""Node agents: everything that runs on a Kubernetes node and touches its hardware."""
