"""A driver pool's upgrade plan, read from its policy's typed upgradePolicy."""

from __future__ import annotations

from typing import Any

from nicop.operator.upgrade import automatic_plan


def policy(upgrade: dict[str, Any] | None) -> dict[str, Any]:
    driver = {"version": "26.07-0.7.0.0"} | ({"upgradePolicy": upgrade} if upgrade else {})
    return {"kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"},
            "spec": {"ofedDriver": driver}}


def test_only_automatic_upgrades_have_a_plan() -> None:
    assert automatic_plan(policy(None)) is None
    assert automatic_plan(policy({"autoUpgrade": False, "maxParallelUpgrades": 4})) is None
    # Not automatic, a value the schema refuses holds nothing.
    assert automatic_plan(policy({"autoUpgrade": False, "maxParallelUpgrades": -1})) is None


def test_unset_settings_are_upstreams_defaults() -> None:
    plan = automatic_plan(policy({"autoUpgrade": True}))
    assert plan is not None and plan.problem is None
    assert plan.spec.max_parallel_upgrades == 1 and plan.spec.max_unavailable is None
    assert plan.drain.enable and plan.drain.timeout_seconds == 300 and not plan.drain.force
    assert plan.wait.pod_selector is None and plan.wait.timeout_seconds == 0


def test_given_settings_are_read() -> None:
    plan = automatic_plan(policy({
        "autoUpgrade": True, "maxParallelUpgrades": 3, "maxUnavailable": "25%",
        "drain": {"enable": True, "force": True, "podSelector": "app=train",
                  "timeoutSeconds": 20, "deleteEmptyDir": True},
        "waitForCompletion": {"podSelector": "job=x", "timeoutSeconds": 60}}))
    assert plan is not None and plan.problem is None
    assert (plan.spec.max_parallel_upgrades, plan.spec.max_unavailable) == (3, "25%")
    assert (plan.drain.pod_selector, plan.drain.timeout_seconds, plan.drain.delete_empty_dir) \
        == ("app=train", 20, True)
    assert (plan.wait.pod_selector, plan.wait.timeout_seconds) == ("job=x", 60)


def test_what_would_upgrade_wrongly_holds_the_pool_and_names_the_field() -> None:
    bad_selector = automatic_plan(policy({"autoUpgrade": True,
                                          "drain": {"podSelector": "app in (a"}}))
    assert bad_selector is not None and bad_selector.problem is not None
    assert bad_selector.problem.startswith("spec.ofedDriver.upgradePolicy.drain.podSelector: ")
    refused = automatic_plan(policy({"autoUpgrade": True, "maxParallelUpgrades": -1}))
    assert refused is not None and refused.problem is not None
    assert refused.problem.startswith("spec.ofedDriver.upgradePolicy.maxParallelUpgrades: ")
    assert "no node of this policy is upgraded until it is valid" in refused.problem
