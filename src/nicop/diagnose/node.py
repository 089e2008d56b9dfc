"""Checks of one node: is it managed, its driver, mofed.wait, its device plugins and agents."""

from __future__ import annotations

from nicop import status as st
from nicop.api import nodes as node_rules
from nicop.api import upgrade
from nicop.api.labels import (
    DRIVER_CONTAINER,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OPT_IN_LABEL,
    POLICY_NAME,
    POOL_LABELS,
    STATE_LABEL,
)
from nicop.diagnose.check import Check, Snapshot, checks_for, registered
from nicop.kube import selectors
from nicop.kube.resources import (
    Obj,
)
from nicop.kube.scheduling import tolerates

OFED_STATE = "state-OFED"
PLUGIN_NAMES = {"state-RDMA-device-plugin": "RDMA shared device plugin",
                "state-SRIOV-device-plugin": "SR-IOV device plugin"}
PLUGIN_SECTIONS = {"state-RDMA-device-plugin": "rdmaSharedDevicePlugin",
                   "state-SRIOV-device-plugin": "sriovDevicePlugin"}
# Taints every DaemonSet pod tolerates (the DaemonSet controller adds these tolerations).
DAEMONSET_TOLERATED = "node.kubernetes.io/"


def node_of(snap: Snapshot, name: str) -> Obj | None:
    return next((n for n in snap.get("nodes") or [] if st.name_of(n) == name), None)


def node_checks(snap: Snapshot, name: str, *, standalone: bool) -> list[Check]:
    """The checks of one node; `standalone` adds what the cluster checks would otherwise say."""
    subject = f"node/{name}"
    node = node_of(snap, name)
    if node is None:
        return [Check(subject, "node", "fail", f"node {name} does not exist",
                      "kubectl get nodes")]
    checks = [c for r in checks_for("node") for c in r.run(snap, node)]
    labels = st.labels_of(node)
    if reason := st.unmanaged_nic(snap, node):
        if labels.get(OPT_IN_LABEL) == "false":
            checks.append(Check(
                subject, "managed", "warn",
                f"node {name} has a Mellanox NIC but is opted out ({OPT_IN_LABEL}=false): nicop "
                "deploys nothing there",
                f"if that is not intended: kubectl label node {name} {OPT_IN_LABEL}-"))
        elif not any(node_rules.CLASS_VENDOR_LABEL.match(k) for k in labels):
            checks.append(_unlabelled_nic_check(node, reason))
        else:
            found = sorted(k for k in labels if node_rules.CLASS_VENDOR_LABEL.match(k))
            checks.append(Check(
                subject, "managed", "fail",
                f"node {name} has a Mellanox NIC (NFD label {found[0] if found else '?'}) but "
                f"not the label {MELLANOX_LABEL}=true the operator selects nodes by, so it gets "
                "no driver, device plugin or CNI, and the policy's DaemonSets leave it out",
                f"kubectl label node {name} {MELLANOX_LABEL}=true (lasting: configure NFD's "
                "pci deviceLabelFields to [vendor], or deploy a NodeFeatureRule for vendor "
                "15b3)"))
        return checks
    if not node_rules.is_managed(node):
        checks.append(Check(
            subject, "managed", "warn",
            f"Node Feature Discovery found no Mellanox NIC on node {name} and it is not opted "
            "in: nicop leaves it alone",
            f"if it has a ConnectX NIC: run NFD, or kubectl label node {name} "
            f"{OPT_IN_LABEL}=true"))
        return checks
    via = (f"{MELLANOX_LABEL}=true" if labels.get(MELLANOX_LABEL) == "true"
           else f"{OPT_IN_LABEL}=true")
    checks.append(Check(subject, "managed", "pass", f"managed ({via})"))
    policy = st.policy_of(snap)
    if policy is None:
        if standalone:
            checks.append(Check(subject, "policy", "fail",
                                f"there is no NicClusterPolicy {POLICY_NAME}: nothing is "
                                "deployed to this node", "kubectl apply -f <policy>.yaml"))
        return checks
    checks.extend(c for r in checks_for("managed node") for c in r.run(snap, node, policy))
    return checks


@registered("node ready", "node")
def _ready_check(snap: Snapshot, node: Obj) -> list[Check]:
    if st.node_ready(node):
        return []
    name = st.name_of(node)
    return [Check(f"node/{name}", "node ready", "fail",
                  f"node {name} is NotReady: nothing new starts on it",
                  f"kubectl describe node {name}")]


def _unlabelled_nic_check(node: Obj, reason: str) -> Check:
    """A node that shows its Mellanox NIC in other ways but lost (or never had) the label the
    operator selects by: a failure, with the label command and the NFD hint."""
    name = st.name_of(node)
    message, _, _ = reason.partition("; label it")
    return Check(
        f"node/{name}", "managed", "fail", message,
        f"kubectl label node {name} {MELLANOX_LABEL}=true (lasting: check that Node Feature "
        "Discovery runs on the node and labels vendor 15b3: pci deviceLabelFields [vendor], or "
        "a NodeFeatureRule)")


def _wanted_driver_version(policy: Obj) -> str | None:
    spec = policy.get("spec") or {}
    version = (spec.get("ofedDriver") or {}).get("version") or (spec.get("global") or {}).get(
        "version")
    return str(version) if version else None


@registered("driver", "managed node")
def _driver_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    ns = snap["namespace"]
    name = st.name_of(node)
    subject = f"node/{name}"
    spec = (policy.get("spec") or {}).get("ofedDriver")
    if not spec:
        return [Check(subject, "driver", "pass",
                      "the policy has no ofedDriver section: the node's own (inbox) driver is "
                      "used")]
    driver = st.driver_of(snap, node)
    checks = []
    if driver is None:
        pools = [ds for ds in snap.get("daemonSets") or []
                 if st.labels_of(ds).get(STATE_LABEL) == OFED_STATE]
        selecting = [ds for ds in pools if _selector_mismatch(ds, node) == []]
        if not pools:
            cause, fix = ("the operator has not created a driver DaemonSet yet",
                          "see the component state-OFED in `nicop status`")
        elif not selecting:
            values = ", ".join(f"{k}={st.labels_of(node).get(k, '<unset>')}"
                               for k in POOL_LABELS)
            cause = (f"no driver DaemonSet selects it: its OS and kernel labels ({values}) "
                     "match no driver pool")
            fix = ("let NFD label the node's OS and kernel (system-os_release.ID, "
                   "system-os_release.VERSION_ID, kernel-version.full); the operator then "
                   "renders a DaemonSet for its pool")
        else:
            cause, fix = _why_no_pod(snap, selecting[0], node)
        checks.append(Check(subject, "driver", "fail",
                            f"no driver pod on node {name}: {cause}", fix))
    elif driver["heldReload"]:
        for held in driver["heldReload"]:
            checks.append(Check(
                subject, "driver reload", "fail",
                f"the driver agent of pod {ns}/{driver['pod']} holds the driver reload on node "
                f"{name} (the running driver stays loaded): {held['cause']}",
                f"{held['fix']}; the agent checks again every few seconds and reloads once "
                "nothing holds it, with no restart"))
    elif not driver["ready"]:
        pod = driver["pod"]
        restarts = driver["restarts"]
        checks.append(Check(
            subject, "driver", "fail",
            f"driver container {DRIVER_CONTAINER} of pod {ns}/{pod} is not Ready "
            f"({driver['problem'] or 'readiness probe failing'}; {restarts} restarts): the "
            f"driver is not loaded, so nothing on this node can use RDMA. Readiness is the "
            f"container's Ready: its startup probe checks {st.READY_FILE} on the node, which "
            "the API cannot show",
            f"kubectl -n {ns} logs {pod} -c {DRIVER_CONTAINER}"
            + (" --previous" if restarts else "")
            + " (missing kernel headers and unreachable package repositories are the usual "
            "causes)"))
    else:
        wanted = _wanted_driver_version(policy)
        state = st.labels_of(node).get(upgrade.STATE_LABEL)
        auto = bool((spec.get("upgradePolicy") or {}).get("autoUpgrade"))
        if wanted and driver["version"] != wanted:
            fix = ("the upgrade controller replaces it node by node; follow it with "
                   "`nicop status --watch`" if auto else
                   f"kubectl -n {ns} delete pod {driver['pod']} (the DaemonSet uses OnDelete), "
                   "or enable spec.ofedDriver.upgradePolicy.autoUpgrade")
            checks.append(Check(subject, "driver", "warn",
                                f"driver {driver['version']} is ready but the policy asks for "
                                f"{wanted} (upgrade state: {state or 'none'})", fix))
        else:
            checks.append(Check(subject, "driver", "pass",
                                f"driver {driver['version']} ready (pod {driver['pod']})"))
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    blocked = annotations.get(upgrade.DRAIN_BLOCKED_ANNOTATION)
    if st.labels_of(node).get(upgrade.STATE_LABEL) == upgrade.DRAIN and blocked:
        checks.append(Check(
            subject, "driver upgrade", "warn",
            f"the driver upgrade's drain of node {name}, started at "
            f"{annotations.get(upgrade.DRAIN_START_ANNOTATION)}, cannot evict: {blocked}",
            "let the pods go (relax the PodDisruptionBudget named, or scale its workload); the "
            "drain goes on by itself, and past its timeout the node fails and is retried"))
    if st.labels_of(node).get(upgrade.STATE_LABEL) == upgrade.FAILED:
        reason = annotations.get(upgrade.FAILURE_ANNOTATION)
        retry_at = annotations.get(upgrade.RETRY_AT_ANNOTATION)
        then = (f"the operator retries it at {retry_at}" if retry_at else
                "no automatic retry is left")
        pod = driver["pod"] if driver else "<driver pod>"
        checks.append(Check(
            subject, "driver upgrade", "fail",
            f"the driver upgrade failed on node {name}" + (f": {reason}" if reason else "")
            + f" ({upgrade.attempts(node)} failed attempt(s); {then})",
            f"kubectl -n {ns} logs {pod} -c {DRIVER_CONTAINER}; once the cause is fixed, "
            f"`nicop upgrade retry {name}` retries it at once (the node also moves on by itself "
            "once the driver container is Ready)"))
    return checks


@registered("mofed.wait", "managed node")
def _mofed_wait_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    return [_mofed_wait_check(snap, node)]


def _mofed_wait_check(snap: Snapshot, node: Obj) -> Check:
    name = st.name_of(node)
    value = st.labels_of(node).get(MOFED_WAIT_LABEL)
    subject = f"node/{name}"
    if value == "false":
        return Check(subject, "mofed.wait", "pass",
                     f"{MOFED_WAIT_LABEL}=false: components that wait for the driver may run")
    driver = st.driver_of(snap, node)
    if value == "true":
        if driver is not None and driver["ready"]:
            fix = "the driver is ready but the operator has not updated the label: see the " \
                  "operator check (nicop diagnose)"
        else:
            fix = "make the driver container Ready (see the driver check)"
        return Check(subject, "mofed.wait", "fail",
                     f"{MOFED_WAIT_LABEL}=true: the device plugins and other components that "
                     "wait for the driver stay off this node until its driver container is Ready",
                     fix)
    return Check(subject, "mofed.wait", "fail",
                 f"the node has no {MOFED_WAIT_LABEL} label: the operator has not processed "
                 "it, so no component selects it",
                 "see the operator check (nicop diagnose); the operator labels managed nodes "
                 "within seconds")


def _selector_mismatch(ds: Obj, node: Obj) -> list[tuple[str, str]]:
    """The (label, wanted value) pairs of a DaemonSet's nodeSelector the node does not have."""
    selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "nodeSelector") or {}
    labels = st.labels_of(node)
    return [(k, str(v)) for k, v in selector.items() if labels.get(k) != v]


def _why_no_pod(snap: Snapshot, ds: Obj, node: Obj) -> tuple[str, str]:
    """Why a DaemonSet has no pod on a node, and the fix: labels, affinity, taints."""
    ns = snap["namespace"]
    name = st.name_of(node)
    pod_spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    labels = st.labels_of(node)
    for key, wanted in _selector_mismatch(ds, node):
        have = labels.get(key)
        if key == MOFED_WAIT_LABEL:
            return (f"it waits for the driver: the node has {key}="
                    f"{have if have is not None else '<unset>'}, the DaemonSet needs {wanted}",
                    "make the driver container Ready (see the driver check)")
        return (f"the node lacks the label {key}={wanted} the DaemonSet selects "
                f"(it has {have if have is not None else 'none'})",
                f"kubectl label node {name} {key}={wanted}")
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not selectors.matches_node_selector(required, node):
        return ("the node does not match the DaemonSet's required nodeAffinity (spec."
                "nodeAffinity of the policy)",
                f"kubectl edit nicclusterpolicy {POLICY_NAME} (spec.nodeAffinity), or label "
                "the node to match it")
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if str(taint.get("key", "")).startswith(DAEMONSET_TOLERATED):
            continue
        if not tolerates(tolerations, taint):
            key, value, effect = taint.get("key"), taint.get("value"), taint.get("effect")
            shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
            return (f"the node has the taint {shown}, which the DaemonSet does not tolerate",
                    f"add {{key: {key}, operator: Exists, effect: {effect}}} to spec.tolerations "
                    f"of the NicClusterPolicy (kubectl edit nicclusterpolicy {POLICY_NAME}), or "
                    f"remove the taint: kubectl taint node {name} {key}-")
    return ("the DaemonSet controller has not created it (yet)",
            f"kubectl -n {ns} describe daemonset {st.name_of(ds)}")


@registered("device plugins", "managed node")
def _plugin_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    ns = snap["namespace"]
    name = st.name_of(node)
    subject = f"node/{name}"
    configured = st.configured_resources(policy)
    checks = []
    for ds in sorted(snap.get("daemonSets") or [], key=st.name_of):
        state = st.labels_of(ds).get(STATE_LABEL, "")
        if state not in PLUGIN_NAMES:
            continue
        what = PLUGIN_NAMES[state]
        pods = [p for p in st.pods_on(snap, name)
                if (p.get("metadata") or {}).get("namespace") == ns
                and st.owner_name(p, "DaemonSet") == st.name_of(ds)]
        if not pods:
            cause, fix = _why_no_pod(snap, ds, node)
            checks.append(Check(subject, what, "fail",
                                f"no {what} pod ({st.name_of(ds)}) runs on node {name}: {cause}; "
                                "pods there get none of its devices", fix))
            continue
        pod = pods[0]
        if not st.pod_ready(pod):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            problem = next((p for c in statuses if (p := st.container_problem(c))),
                           (pod.get("status") or {}).get("phase", "not ready"))
            checks.append(Check(subject, what, "fail",
                                f"{what} pod {ns}/{st.name_of(pod)} is not ready: {problem}",
                                f"kubectl -n {ns} logs {st.name_of(pod)}"))
            continue
        checks.append(Check(subject, what, "pass",
                            f"{what} pod {st.name_of(pod)} is running"))
        checks.extend(_resource_checks(snap, node, state, configured.get(state) or [],
                                       st.name_of(pod)))
    return checks


def _resource_checks(snap: Snapshot, node: Obj, state: str, names: list[str],
                     pod: str) -> list[Check]:
    if not names:
        return []
    ns = snap["namespace"]
    subject = f"node/{st.name_of(node)}"
    what = PLUGIN_NAMES[state]
    resources = {r["name"]: r for r in st.node_resources(snap, node, names) if r["name"] in names}
    advertised = [r for r in resources.values() if r["capacity"] > 0 or r["allocatable"] > 0]
    if not advertised:
        hint = " (no VFs on this node? see the VFs check)" if "SRIOV" in state else ""
        return [Check(
            subject, "resources", "warn",
            f"the {what} advertises none of {', '.join(names)} on this node: its selectors "
            f"match no device here{hint}",
            f"compare the selectors in spec.{PLUGIN_SECTIONS[state]}.config with the node's "
            f"NICs; the plugin logs what it found: kubectl -n {ns} logs {pod}")]
    checks = []
    for r in advertised:
        if r["allocatable"] == 0:
            checks.append(Check(
                subject, f"resource {r['name']}", "fail",
                f"{r['name']}: {r['capacity']} devices, none allocatable: they are unhealthy "
                "(link down?) or the plugin lost its registration with the kubelet",
                f"kubectl -n {ns} logs {pod}"))
        elif r["inUse"] >= r["allocatable"]:
            checks.append(Check(
                subject, f"resource {r['name']}", "warn",
                f"{r['name']}: all {r['allocatable']} in use; new pods asking for one wait",
                "wait for pods to finish, or raise the count ("
                + ("numVfs in the SriovNetworkNodePolicy" if "SRIOV" in state else
                   "rdmaHcaMax in spec.rdmaSharedDevicePlugin.config") + ")"))
        else:
            checks.append(Check(
                subject, f"resource {r['name']}", "pass",
                f"{r['name']}: {r['allocatable']} allocatable, {r['inUse']} in use"))
    return checks


@registered("agents", "node")
def _agent_checks(snap: Snapshot, node: Obj) -> list[Check]:
    """The operator's other DaemonSets on this node (the SR-IOV config daemon and device plugin,
    the CNI daemon): each pod running, or why not in the kubelet's words."""
    name, ns = st.name_of(node), snap["namespace"]
    policy_daemonsets = {st.name_of(ds) for ds in snap.get("daemonSets") or []}
    checks = []
    for pod in sorted(st.pods_on(snap, name), key=st.name_of):
        owner = st.owner_name(pod, "DaemonSet")
        if ((pod.get("metadata") or {}).get("namespace") != ns or owner is None
                or owner in policy_daemonsets):
            continue
        if st.pod_ready(pod):
            checks.append(Check(f"node/{name}", owner, "pass", f"pod {st.name_of(pod)} is ready"))
            continue
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        problem = next((p for c in statuses if (p := st.container_problem(c))),
                       (pod.get("status") or {}).get("phase", "not ready"))
        checks.append(Check(f"node/{name}", owner, "fail",
                            f"{owner} pod {ns}/{st.name_of(pod)} is not ready: {problem}",
                            f"kubectl -n {ns} logs {st.name_of(pod)} --previous"))
    return checks


@registered("sr-iov", "managed node")
def _sriov_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    name = st.name_of(node)
    subject = f"node/{name}"
    state = st.node_state_of(snap, name)
    info = st.sriov_of(state)
    if state is None or info is None:
        return []
    ns = (state.get("metadata") or {}).get("namespace") or snap["namespace"]
    show = f"kubectl -n {ns} get sriovnetworknodestate {name} -o yaml"
    checks = []
    found = {i.get("pciAddress"): i for i in (state.get("status") or {}).get("interfaces") or []}
    for wanted in (state.get("spec") or {}).get("interfaces") or []:
        have = found.get(wanted.get("pciAddress")) or {}
        total, num = have.get("totalvfs"), int(wanted.get("numVfs") or 0)
        if isinstance(total, int) and num > total:
            pf = wanted.get("name") or wanted.get("pciAddress")
            checks.append(Check(
                subject, "VFs", "fail",
                f"{num} VFs are wanted on PF {pf}, which supports {total}",
                f"lower numVfs to at most {total} in the SriovNetworkNodePolicy selecting {pf} "
                "(or raise SRIOV_NUM_OF_VFS in the NIC firmware with mlxconfig)"))
    sync, error = info["syncStatus"], info["lastSyncError"]
    have, want = info["vfsConfigured"], info["vfsWanted"]
    if sync == "Failed":
        checks.append(Check(subject, "VFs", "fail",
                            f"SR-IOV configuration failed ({have} of {want} VFs): "
                            f"{error or 'no error given'}",
                            f"{show}; correct the SriovNetworkNodePolicy that selects this node"))
    elif have < want:
        if sync == "Succeeded":
            checks.append(Check(subject, "VFs", "fail",
                                f"only {have} of {want} VFs exist although the sync says "
                                "Succeeded", f"{show}; the config daemon's log tells more"))
        else:
            checks.append(Check(subject, "VFs", "warn",
                                f"{have} of {want} VFs configured so far (sync "
                                f"{sync or 'not started'})"
                                + (f"; last error: {error}" if error else ""),
                                f"wait, or watch it: kubectl -n {ns} get "
                                f"sriovnetworknodestate {name} -w"))
    elif want:
        checks.append(Check(subject, "VFs", "pass",
                            f"{have} of {want} VFs configured (sync {sync or 'unknown'})"))
    return checks


