"""The controller runtime against the real API server: informers, leases, events, probes."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests.eventually import until

from nicop.kube.client import ApiClient
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.leader import LeaderElector
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import CONFIGMAP, EVENT, LEASE, NODE, Resource
from nicop.kube.times import utcnow
from nicop_sim.cluster import free_port

T = TypeVar("T")


def run(kubeconfig: Path, body: Callable[[ApiClient], Awaitable[T]]) -> T:
    async def main() -> T:
        client = ApiClient(kubeconfig)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def configmap(name: str, namespace: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"k": "v"}}


def test_informer_follows_adds_updates_deletes_with_a_label_selector(
    kubeconfig: Path, namespace: str
) -> None:
    async def body(client: ApiClient) -> None:
        informer = Informer(client, CONFIGMAP, namespace, label_selector="app=mine")
        events: list[tuple[str, str]] = []
        informer.on_change(lambda ev, obj, old: events.append((ev, obj["metadata"]["name"])))
        await client.create(configmap("before", namespace, app="mine"))
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert informer.store.get(f"{namespace}/before") is not None

        await client.create(configmap("after", namespace, app="mine"))
        await client.create(configmap("other", namespace, app="theirs"))
        await client.patch(CONFIGMAP, "before", {"data": {"k": "w"}}, namespace)
        await client.delete(CONFIGMAP, "after", namespace)
        await until(lambda: ("DELETED", "after") in events)
        assert informer.store.get(f"{namespace}/before")["data"] == {"k": "w"}  # type: ignore[index]
        assert ("MODIFIED", "before") in events
        assert all(name != "other" for _, name in events), "the selector is applied by the server"
        task.cancel()

    run(kubeconfig, body)


def test_an_assumed_write_is_not_told_again_when_its_watch_event_arrives(
    kubeconfig: Path, namespace: str
) -> None:
    """A controller that puts its own write into the cache is not woken by that write's echo
    (a status write would otherwise cost one more reconcile each); someone else's write is.

    The watch is stopped while the write is made and assumed, so its echo surely arrives after
    the assume, when the watch resumes from the last resourceVersion it saw."""
    async def body(client: ApiClient) -> None:
        informer = Informer(client, CONFIGMAP, namespace, label_selector="app=mine")
        events: list[tuple[str, str]] = []
        informer.on_change(lambda ev, obj, old: events.append((ev, obj["data"]["k"])))
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 10)
        await client.create(configmap("mine", namespace, app="mine"))
        await until(lambda: ("ADDED", "v") in events)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        informer.assume(await client.patch(CONFIGMAP, "mine", {"data": {"k": "ours"}}, namespace))
        theirs = await client.patch(CONFIGMAP, "mine", {"data": {"k": "theirs"}}, namespace)
        task = asyncio.create_task(informer.run())
        await until(lambda: ("MODIFIED", "theirs") in events)
        assert events == [("ADDED", "v"), ("MODIFIED", "theirs")]
        cached = informer.store.get(f"{namespace}/mine")
        assert cached is not None
        assert cached["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(kubeconfig, body)


def test_metadata_only_node_informer(kubeconfig: Path) -> None:
    async def body(client: ApiClient) -> None:
        informer = Informer(client, NODE, metadata_only=True)
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 10)
        node = informer.store.get("node-1")
        assert node is not None
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-1"
        assert "status" not in node and "spec" not in node
        task.cancel()

    run(kubeconfig, body)


def test_an_optional_kind_the_api_server_does_not_serve_is_an_empty_synced_cache(
        kubeconfig: Path) -> None:
    """A cluster without resource.k8s.io/v1 (before Kubernetes 1.34) answers 404 for
    DeviceClasses; stood in for by a version no API server serves. The operator's optional
    informer is synced, connected (so /readyz holds) and empty; a required one is not synced."""
    unserved = Resource("resource.k8s.io", "v1alpha0", "DeviceClass", "deviceclasses",
                        namespaced=False)

    async def body(client: ApiClient) -> None:
        optional = Informer(client, unserved, optional=True)
        required = Informer(client, unserved)
        tasks = [asyncio.create_task(i.run()) for i in (optional, required)]
        try:
            await asyncio.wait_for(optional.synced.wait(), 10)
            assert optional.connected and not len(optional.store)
            assert not required.synced.is_set() and not required.connected
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    run(kubeconfig, body)


def test_leader_election_hands_over_when_the_leader_stops_renewing(
    kubeconfig: Path, namespace: str
) -> None:
    async def body(client: ApiClient) -> None:
        timing = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}
        first = LeaderElector(client, namespace, "lock", "first", **timing)
        second = LeaderElector(client, namespace, "lock", "second", **timing)
        await first.acquire()
        keeping = asyncio.create_task(first.keep())
        waiting = asyncio.create_task(second.acquire())
        # Evidence it had its chance: tries spread over more than one lease duration.
        await until(lambda: second.attempts > timing["lease_duration"] / timing["retry_period"]
                    + 2, 30, "the second candidate to try over a whole lease duration")
        assert not waiting.done(), "a second candidate must wait while the leader renews"
        keeping.cancel()  # the leader dies without releasing
        start = asyncio.get_running_loop().time()
        await asyncio.wait_for(waiting, 5)
        took = asyncio.get_running_loop().time() - start
        assert took <= timing["lease_duration"] + 2 * timing["retry_period"] + 0.5
        lease = await client.get(LEASE, "lock", namespace)
        assert lease["spec"]["holderIdentity"] == "second"
        assert lease["spec"]["leaseTransitions"] == 1

    run(kubeconfig, body)


@pytest.mark.parametrize("skew", [-60.0, 60.0], ids=["leader-behind", "leader-ahead"])
def test_leader_election_ignores_clock_skew_between_replicas(
    kubeconfig: Path, namespace: str, skew: float
) -> None:
    """The leader's wall clock is `skew` seconds off the standby's (far more than the lease
    duration): the standby never leads while the leader renews, and takes over within one lease
    duration once it stops, as client-go decides expiry (from when the standby saw the record
    change, on its own clock)."""
    async def body(client: ApiClient) -> None:
        timing = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}
        first = LeaderElector(client, namespace, "skewed", "first", **timing,
                              clock=lambda: utcnow() + datetime.timedelta(seconds=skew))
        second = LeaderElector(client, namespace, "skewed", "second", **timing)
        await first.acquire()
        keeping = asyncio.create_task(first.keep())
        waiting = asyncio.create_task(second.acquire())
        # Evidence it had its chance: tries spread over three lease durations.
        await until(lambda: second.attempts > 3 * timing["lease_duration"]
                    / timing["retry_period"], 60, "the standby to try over three lease durations")
        assert not waiting.done() and not keeping.done(), "two leaders at once"
        keeping.cancel()  # the leader dies without releasing
        start = asyncio.get_running_loop().time()
        await asyncio.wait_for(waiting, 10)
        took = asyncio.get_running_loop().time() - start
        assert took <= timing["lease_duration"] + 2 * timing["retry_period"] + 0.5, took
        lease = await client.get(LEASE, "skewed", namespace)
        assert lease["spec"]["holderIdentity"] == "second"

    run(kubeconfig, body)


def test_repeated_events_are_counted_not_duplicated(kubeconfig: Path, namespace: str) -> None:
    async def body(client: ApiClient) -> None:
        cm = await client.create(configmap("subject", namespace))
        recorder = EventRecorder(client)
        await recorder.emit(cm, "Warning", "NotReady", "rdma device plugin not ready")
        await recorder.emit(cm, "Warning", "NotReady", "rdma device plugin not ready")
        events, _ = await client.list(EVENT, namespace)
        mine = [e for e in events if e["involvedObject"]["name"] == "subject"]
        assert len(mine) == 1
        assert mine[0]["count"] == 2
        assert mine[0]["reason"] == "NotReady"

    run(kubeconfig, body)


def test_manager_reconciles_and_serves_probes_and_metrics(
    kubeconfig: Path, namespace: str
) -> None:
    port = free_port()

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""

    async def body(client: ApiClient) -> None:
        manager = Manager(client, health_address=("127.0.0.1", port))
        informer = manager.informer(CONFIGMAP, namespace)
        seen: list[str] = []
        attempts: dict[str, int] = {}

        async def reconcile(key: str) -> Result | None:
            attempts[key] = attempts.get(key, 0) + 1
            if key.endswith("/flaky") and attempts[key] < 3:
                raise RuntimeError("transient")
            seen.append(key)
            return None

        controller = manager.add(Controller("probe", reconcile))
        informer.on_change(lambda ev, obj, old: controller.queue.add(
            f"{namespace}/{obj['metadata']['name']}"))
        task = asyncio.create_task(manager.run())
        await until(lambda: manager.server is not None)
        await until(lambda: manager.ready)
        assert await asyncio.to_thread(get, "/readyz") == (200, "ok")
        assert (await asyncio.to_thread(get, "/healthz"))[0] == 200
        await client.create(configmap("flaky", namespace))
        await until(lambda: f"{namespace}/flaky" in seen)
        assert attempts[f"{namespace}/flaky"] == 3, "errors are retried with backoff"
        status, metrics = await asyncio.to_thread(get, "/metrics")
        assert status == 200
        assert 'nicop_reconcile_total{controller="probe",result="error"} 2.0' in metrics
        assert 'nicop_api_requests_total{resource="configmaps",verb="create"}' in metrics
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(kubeconfig, body)
