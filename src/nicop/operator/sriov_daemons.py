"""What runs on the nodes for SR-IOV policies: the config daemon and the SR-IOV device plugin.

As upstream's sriov-network-operator does, once an SriovNetworkNodePolicy exists:
- the SriovOperatorConfig `default` is created in the operator namespace when there is none
  (`configDaemonNodeSelector: {}`, `logLevel: 2`, drain disabled on a single-node cluster);
- DaemonSet `sriov-network-config-daemon` runs `nicop sriov-config-daemon` on the nodes of its
  `configDaemonNodeSelector` (empty: `kubernetes.io/os=linux` and
  `node-role.kubernetes.io/worker`), with the node's root at /host;
- DaemonSet `sriov-device-plugin` runs `nicop sriov-device-plugin` on those of them labelled
  `sriovnetwork.openshift.io/device-plugin=Enabled`, each reading its node's key of the
  `device-plugin-config` ConfigMap that `operator.sriov` renders.
Both belong to the SriovOperatorConfig (deleted with it). When the last policy goes, the device
plugin goes at once; the config daemon stays until every node state it applied has been reset
(its empty spec applied, condition `Ready` for that generation), so no VF outlives its policy.
The config's `Ready` condition says whether the daemons are rolled out.
"""

from __future__ import annotations

import logging

from nicop import logs
from nicop.api.agents import METRICS_PORTS, own_image
from nicop.api.labels import DEVICE_PLUGIN_LABEL
from nicop.api.sriovnetwork import operator_settings
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import NODE, Obj
from nicop.operator.components import Components
from nicop.operator.sriov import (
    CONFIG_MAP_NAME,
    DEFAULT_DAEMON_NODE_SELECTOR,
    DEPRECATED_DEFAULT_POLICY,
    POLICY,
)
from nicop.operator.sriov_drain import (
    CONFIG_NAME,
    NODE_STATE,
    OPERATOR_CONFIG,
    operator_config,
    resource_prefix,
)
from nicop.operator.states.base import (
    EVENTS_RULE,
    Context,
    agent_container,
    cluster_rbac,
    daemonset,
    host_path,
    service_account,
)
from nicop.operator.writes import WriteFailed

log = logging.getLogger(__name__)

CONFIG_DAEMON = "sriov-network-config-daemon"
DEVICE_PLUGIN = "sriov-device-plugin"
TOLERATE_ALL = [{"operator": "Exists"}]
ROLLOUT_RECHECK = 10.0
NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def default_config(namespace: str, single_node: bool) -> Obj:
    """The SriovOperatorConfig upstream's operator creates at start."""
    return {"apiVersion": OPERATOR_CONFIG.api_version, "kind": OPERATOR_CONFIG.kind,
            "metadata": {"name": CONFIG_NAME, "namespace": namespace},
            "spec": {"enableInjector": False, "enableOperatorWebhook": False,
                     "configDaemonNodeSelector": {}, "logLevel": 2,
                     "disableDrain": single_node}}


def node_selector(config: Obj) -> dict[str, str]:
    return dict(operator_settings(config).config_daemon_node_selector
                or DEFAULT_DAEMON_NODE_SELECTOR)


def render_config_daemon(ctx: Context, config: Obj) -> list[Obj]:
    settings = operator_settings(config)
    volume, mount = host_path("host", "/", "/host")
    env: list[Obj] = [NODE_NAME_ENV,
                      {"name": "NAMESPACE",
                       "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                      *({"name": k, "value": v} for k, v in sorted(
                          (settings.config_daemon_env_vars or {}).items()))]
    ds = daemonset(
        ctx, CONFIG_DAEMON, None,
        [agent_container(ctx, CONFIG_DAEMON, None, ["sriov-config-daemon", "--host-root", "/host"],
                         mounts=[mount], env=env,
                         metrics_port=METRICS_PORTS["sriov-config-daemon"])],
        app=CONFIG_DAEMON, node_selector=node_selector(config), volumes=[volume],
        service_account_name=CONFIG_DAEMON, managed_only=False, tolerations=TOLERATE_ALL,
        labels={"component": "network", "type": "infra"},
    )
    pod = ds["spec"]["template"]["spec"]
    pod["hostPID"] = True
    pod["nodeSelector"] = node_selector(config)  # exactly the config's, as upstream
    return [service_account(ctx, CONFIG_DAEMON), *cluster_rbac(ctx, CONFIG_DAEMON, [
        {"apiGroups": ["sriovnetwork.openshift.io"],
         "resources": ["sriovnetworknodestates", "sriovnetworknodestates/status"],
         "verbs": ["get", "list", "watch", "update", "patch"]},
        {"apiGroups": ["sriovnetwork.openshift.io"], "resources": ["sriovoperatorconfigs"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    ]), ds]


def render_device_plugin(ctx: Context, config: Obj) -> list[Obj]:
    volumes, mounts = [], []
    for name, path in (("devicesock", "/var/lib/kubelet/device-plugins"),
                       ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
                       ("log", "/var/log"),
                       ("device-info", "/var/run/k8s.cni.cncf.io/devinfo/dp")):
        volume, mount = host_path(name, path, type_="DirectoryOrCreate")
        volumes.append(volume)
        mounts.append(mount)
    volumes.append({"name": "config", "configMap": {"name": CONFIG_MAP_NAME}})
    mounts.append({"name": "config", "mountPath": "/etc/pcidp", "readOnly": True})
    plugin = agent_container(
        ctx, DEVICE_PLUGIN, None,
        ["sriov-device-plugin", "--config-file=/etc/pcidp/$(NODE_NAME)",
         f"--resource-prefix={resource_prefix()}"],
        mounts=mounts, env=[NODE_NAME_ENV],
        metrics_port=METRICS_PORTS["sriov-operator-device-plugin"])
    ds = daemonset(ctx, DEVICE_PLUGIN, None, [plugin], app=DEVICE_PLUGIN, volumes=volumes,
                   service_account_name=DEVICE_PLUGIN, managed_only=False,
                   tolerations=TOLERATE_ALL)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {**node_selector(config),
                                                      DEVICE_PLUGIN_LABEL: "Enabled"}
    return [service_account(ctx, DEVICE_PLUGIN), *cluster_rbac(ctx, DEVICE_PLUGIN, [EVENTS_RULE]),
            ds]


def settled(state: Obj) -> bool:
    """The node state asks for no PF and its daemon has applied that, or no daemon ever ran
    for it."""
    if (state.get("spec") or {}).get("interfaces"):
        return False
    ready = next((c for c in (state.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), None)
    return ready is None or (ready.get("status") == "True" and ready.get(
        "observedGeneration") == state["metadata"].get("generation"))


class SriovDaemonsController:
    KEY = "sriov-daemons"

    def __init__(self, manager: Manager, namespace: str) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.configs = manager.informer(OPERATOR_CONFIG, namespace)
        self.policies = manager.informer(POLICY, namespace)
        self.states = manager.informer(NODE_STATE, namespace)
        self.nodes = manager.informer(NODE)  # labels only; shared with the other controllers
        self.controller = manager.add(Controller(self.KEY, self.reconcile))
        for informer in (self.configs, self.policies):
            informer.on_change(lambda ev, obj, old: self.controller.queue.add(self.KEY))
        self.states.on_change(lambda ev, obj, old: self.controller.queue.add_batched(self.KEY))
        self.components = Components(manager, namespace, (CONFIG_DAEMON, DEVICE_PLUGIN),
                                     lambda name: self.controller.queue.add(self.KEY))

    async def reconcile(self, key: str) -> Result | None:
        policies = [p for p in self.policies.store.items()
                    if p["metadata"]["name"] != DEPRECATED_DEFAULT_POLICY]
        config = operator_config(self.configs.store.items(), self.namespace)
        if not policies:
            done = all(settled(s) for s in self.states.store.items())
            for name in (DEVICE_PLUGIN, *([CONFIG_DAEMON] if done else [])):
                if await self.components.remove(name):
                    log.info("no SR-IOV policy left: removed %s", name,
                             extra=logs.about("DaemonSet", name, self.namespace))
            if done or config is None:
                return None
            problems = await self.components.sync(CONFIG_DAEMON, render_config_daemon(
                Context({"spec": {}}, self.namespace, agent_image=own_image()), config), config)
            await self._condition(config, problems or ["resetting the nodes' VFs"])
            return Result(requeue_after=ROLLOUT_RECHECK)
        if config is None:
            body = default_config(self.namespace, single_node=len(self.nodes.store) == 1)
            try:
                self.configs.assume(await self.client.create(body, res=OPERATOR_CONFIG))
                log.info("created the default SriovOperatorConfig",
                         extra=logs.about(OPERATOR_CONFIG.kind, CONFIG_NAME, self.namespace))
            except ApiError as e:
                if e.code != 409:
                    raise
            return Result(requeue_after=0.1)
        ctx = Context({"spec": {}}, self.namespace, agent_image=own_image())
        try:
            problems = [
                *await self.components.sync(CONFIG_DAEMON, render_config_daemon(ctx, config),
                                            config),
                *await self.components.sync(DEVICE_PLUGIN, render_device_plugin(ctx, config),
                                            config),
            ]
        except WriteFailed as e:  # said in the condition, and tried again later
            await self._condition(config, [str(e)])
            raise
        await self._condition(config, problems)
        return Result(requeue_after=ROLLOUT_RECHECK) if problems else None

    async def _condition(self, config: Obj, problems: list[str]) -> None:
        """SriovOperatorConfig condition `Ready`: the daemons rolled out, or what is missing."""
        conditions = with_condition(
            (config.get("status") or {}).get("conditions") or [], "Ready", not problems,
            "DaemonsNotReady" if problems else "DaemonsReady",
            "; ".join(problems) or "the config daemon and the device plugin run on every "
            "selected node", config["metadata"].get("generation", 0))
        if conditions is None:
            return
        try:
            self.configs.assume(await self.client.patch(
                OPERATOR_CONFIG, CONFIG_NAME, {"status": {"conditions": conditions}},
                self.namespace, subresource="status"))
        except ApiError as e:
            if e.code != 404:
                raise
