"""Which pool a node drains in, how many of a pool may drain at once, which pods a drain evicts."""

from __future__ import annotations

from typing import Any

import pytest

from nicop.operator.sriov_drain import PoolError, pool_limit, pool_of, uses_resource


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def pool(name: str, selector: dict[str, Any] | None, max_unavailable: Any = None
         ) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["nodeSelector"] = selector
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"metadata": {"name": name}, "spec": spec}


def test_nodes_in_no_pool_drain_one_at_a_time() -> None:
    assert pool_of(node("n1", role="cpu"), [pool("gpu", {"matchLabels": {"role": "gpu"}})]) \
        is None
    assert pool_limit(None, 50) == 1


def test_pool_limits_are_counts_or_percentages_rounded_up() -> None:
    assert pool_limit(pool("p", {}, 2), 5) == 2
    assert pool_limit(pool("p", {}, "10%"), 25) == 3
    assert pool_limit(pool("p", {}), 7) == 7  # no maxUnavailable: no limit


def test_match_expressions_select_pool_members() -> None:
    gpu = pool("gpu", {"matchExpressions": [
        {"key": "role", "operator": "In", "values": ["gpu", "dgx"]},
        {"key": "maintenance", "operator": "DoesNotExist"}]})
    assert pool_of(node("a", role="dgx"), [gpu]) is gpu
    assert pool_of(node("b", role="dgx", maintenance="yes"), [gpu]) is None


def test_a_node_in_two_pools_is_an_error_naming_them() -> None:
    pools = [pool("a", {"matchLabels": {"x": "1"}}), pool("b", {})]
    with pytest.raises(PoolError, match=r"node n matches more than one .* \(a, b\)"):
        pool_of(node("n", x="1"), pools)


def test_pools_for_ovs_offload_only_hold_no_nodes() -> None:
    offload = {"metadata": {"name": "ovs"}, "spec": {"ovsHardwareOffloadConfig": {"name": "w"}}}
    assert pool_of(node("n"), [offload]) is None


def test_drain_required_evicts_only_pods_with_sriov_resources() -> None:
    def pod(resources: dict[str, Any], init: bool = False) -> dict[str, Any]:
        key = "initContainers" if init else "containers"
        return {"spec": {key: [{"name": "c", "resources": resources}]}}

    assert uses_resource(pod({"requests": {"nvidia.com/cx6dx_vf": "1"}}), "nvidia.com")
    assert uses_resource(pod({"limits": {"nvidia.com/vf": "1"}}, init=True), "nvidia.com")
    assert not uses_resource(pod({"requests": {"cpu": "1", "nvidia.com.evil/x": "1"}}),
                             "nvidia.com")
    assert not uses_resource({"spec": {}}, "nvidia.com")


def test_operator_config_log_level_turns_on_debug_logs() -> None:
    import logging

    from nicop.api.sriovnetwork import operator_settings
    from nicop.operator.sriov_drain import SRIOV_LOGGERS, apply_log_level

    try:
        apply_log_level(operator_settings({"spec": {"logLevel": 2}}))
        assert all(logging.getLogger(n).getEffectiveLevel() == logging.DEBUG
                   for n in SRIOV_LOGGERS)
        apply_log_level(operator_settings({"spec": {"logLevel": 0}}))
        assert logging.getLogger(SRIOV_LOGGERS[0]).level == logging.NOTSET
    finally:
        apply_log_level(operator_settings(None))
