"""The kubelet's PodResources API (v1): which devices the kubelet allocated to which pod."""
