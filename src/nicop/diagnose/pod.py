"""Checks of one pod: its networks, devices, DRA claims and what its events say."""

from __future__ import annotations

import re

from nicop import claims
from nicop import status as st
from nicop.api import dra
from nicop.api.labels import (
    NETWORKS_ANNOTATION,
    RESOURCE_NAME_ANNOTATION,
)
from nicop.api.networks_annotation import SelectionError, parse_selections
from nicop.diagnose.check import Check, Snapshot, checks_for, registered
from nicop.diagnose.node import node_of
from nicop.kube.resources import (
    Obj,
    quantity,
)


def _requested(pod: Obj, resource: str) -> int:
    return st.pod_requests(pod).get(resource, 0)


def pod_checks(snap: Snapshot, namespace: str, name: str) -> list[Check]:
    subject = f"pod/{namespace}/{name}"
    pod = snap.get("pod")
    if pod is None:
        return [Check(subject, "pod", "fail", f"pod {namespace}/{name} does not exist",
                      f"kubectl -n {namespace} get pods")]
    status = pod.get("status") or {}
    phase = status.get("phase", "Unknown")
    node = (pod.get("spec") or {}).get("nodeName")
    checks = []
    if phase == "Running" and st.pod_ready(pod):
        checks.append(Check(subject, "pod", "pass", f"Running and ready on node {node}"))
    elif not node:
        checks.append(Check(subject, "pod", "fail",
                            f"{phase}: not scheduled to any node (reasons below)",
                            "see the checks below"))
    else:
        checks.append(Check(subject, "pod", "warn", f"{phase} on node {node}, not ready",
                            f"kubectl -n {namespace} describe pod {name}"))
    checks.extend(c for r in checks_for("pod") for c in r.run(snap, pod, subject))
    return checks


def _networks(snap: Snapshot, pod: Obj, subject: str) -> list[Check]:
    return network_checks(snap, pod, subject)[1]


def _devices(snap: Snapshot, pod: Obj, subject: str) -> list[Check]:
    """Each device resource the pod requests (or that a network it asks for takes)."""
    nad_resources = network_checks(snap, pod, subject)[0]
    wanted = {r: n for r, n in st.pod_requests(pod).items()
              if n > 0 and (st.is_device_resource(r) or r in nad_resources)}
    return [_device_check(snap, pod, subject, resource, count)
            for resource, count in sorted(wanted.items())]


def _claim_checks(snap: Snapshot, pod: Obj, subject: str) -> list[Check]:
    """Each DRA claim of the pod: allocated, or which node comes closest and what it lacks."""
    namespace = pod["metadata"].get("namespace", "default")
    claims = {(c["metadata"].get("namespace"), c["metadata"]["name"]): c
              for c in snap.get("resourceClaims") or []}
    templates = {t["metadata"]["name"]: t for t in snap.get("claim_templates") or []}
    classes = {c["metadata"]["name"]: c for c in snap.get("device_classes") or []}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    checks = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = f"claim {entry['name']}"
        claim_name = entry.get("resourceClaimName") or made.get(entry["name"])
        claim = claims.get((namespace, claim_name)) if claim_name else None
        template = templates.get(entry.get("resourceClaimTemplateName") or "")
        if claim is None and template is None:
            missing = claim_name or entry.get("resourceClaimTemplateName")
            checks.append(Check(subject, name, "fail",
                                f"the pod's claim {entry['name']} names {missing}, which does "
                                f"not exist in namespace {namespace}",
                                f"kubectl -n {namespace} get resourceclaims,"
                                "resourceclaimtemplates"))
            continue
        allocation = ((claim or {}).get("status") or {}).get("allocation")
        if allocation:
            got = ", ".join(f"{r['request']}: {r['device']} ({r['driver']}, pool {r['pool']})"
                            for r in (allocation.get("devices") or {}).get("results") or [])
            checks.append(Check(subject, name, "pass", f"allocated: {got}"))
            continue
        spec = (claim or {}).get("spec") or ((template or {}).get("spec") or {}).get("spec") or {}
        checks.append(_unallocated_claim_check(snap, subject, name, spec, classes))
    return checks


def _unallocated_claim_check(snap: Snapshot, subject: str, name: str, spec: Obj,
                             classes: dict[str, Obj]) -> Check:
    requests, nodes, unknown = claims.fits(spec, classes, snap.get("resourceSlices") or [],
                                           snap.get("resourceClaims") or [])
    missing = sorted({r.device_class for r in requests if r.device_class not in classes})
    if missing:
        return Check(subject, name, "fail",
                     f"DeviceClass {', '.join(missing)} does not exist: no device can match",
                     "install the DRA driver that provides it, or fix deviceClassName "
                     "(kubectl get deviceclasses)")
    asked = "; ".join(f"{r.name}: {max(r.count, 1)} of {r.device_class}" for r in requests)
    constraints = [c["matchAttribute"] for c in (spec.get("devices") or {}).get(
        "constraints") or [] if c.get("matchAttribute")]
    if constraints:
        asked += f"; the same {', '.join(constraints)}"
    note = f" (not evaluated: {'; '.join(sorted(set(unknown)))})" if unknown else ""
    if any(n.fits for n in nodes):
        where = ", ".join(n.node for n in nodes if n.fits)
        return Check(subject, name, "warn",
                     f"not allocated yet, but node(s) {where} have free devices for it "
                     f"({asked}){note}", "kubectl get events --field-selector "
                     "reason=FailedScheduling")
    if not nodes:
        return Check(subject, name, "fail",
                     f"no node publishes DRA devices ({asked}): no ResourceSlice exists",
                     "check that the DRA drivers run on the nodes (kubectl get resourceslices)")
    shown = "; ".join(f"node {n.node}: {n.why}" for n in nodes[:5])
    shown += "".join(f"; {key}: {meaning}" for key, meaning in dra.TAINT_MEANINGS.items()
                     if f"tainted {key}=" in shown)
    return Check(subject, name, "fail",
                 f"no node can satisfy it ({asked}){note}: {shown}",
                 "wait for pods holding these devices to finish (kubectl get resourceclaims -A),"
                 " relax the claim, or add nodes with such devices")


def network_checks(snap: Snapshot, pod: Obj, subject: str) -> tuple[set[str], list[Check]]:
    meta = pod.get("metadata") or {}
    annotation = (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION)
    if annotation is None:
        return set(), []
    try:
        networks = parse_selections(str(annotation), str(meta.get("namespace")))
    except SelectionError as e:
        return set(), [Check(
            subject, "networks", "fail",
            f"the {NETWORKS_ANNOTATION} annotation cannot be read: {e}",
            "write a comma-separated list of [namespace/]name[@interface], or a JSON list of "
            '{"name": ..., "namespace": ..., "interface": ...}')]
    nads = {(m.get("namespace"), m.get("name")): n for n in snap.get("nads") or []
            if (m := n.get("metadata") or {})}
    resources: set[str] = set()
    checks = []
    for net in networks:
        ref = f"{net.namespace}/{net.name}"
        nad = nads.get((net.namespace, net.name))
        if nad is None:
            elsewhere = sorted(f"{ns}/{n}" for ns, n in nads if n == net.name)
            if elsewhere:
                fix = (f"name the one that exists ({', '.join(elsewhere)}) in the annotation, or "
                       f"create the network in namespace {net.namespace}")
            else:
                fix = (f"create it: a HostDeviceNetwork, MacvlanNetwork or IPoIBNetwork "
                       f"(mellanox.com) or a SriovNetwork named {net.name} with "
                       f"networkNamespace {net.namespace}; kubectl get "
                       "network-attachment-definitions -A lists the ones that exist")
            checks.append(Check(
                subject, f"network {ref}", "fail",
                f"the pod asks for network {ref}, but NetworkAttachmentDefinition {ref} does not "
                "exist: Multus cannot attach it and the pod stays in ContainerCreating", fix))
            continue
        resource = ((nad.get("metadata") or {}).get("annotations") or {}).get(
            RESOURCE_NAME_ANNOTATION)
        if not resource:
            checks.append(Check(subject, f"network {ref}", "pass",
                                f"NetworkAttachmentDefinition {ref} exists"))
            continue
        resources.add(resource)
        if _requested(pod, resource) > 0:
            checks.append(Check(subject, f"network {ref}", "pass",
                                f"NetworkAttachmentDefinition {ref} exists; the pod requests the "
                                f"{resource} it needs"))
        else:
            checks.append(Check(
                subject, f"network {ref}", "fail",
                f"network {ref} takes a device of {resource} (its {RESOURCE_NAME_ANNOTATION}), "
                "but the pod does not request one: the CNI has no device to give it",
                f'add to the container: resources: {{requests: {{{resource}: "1"}}, limits: '
                f'{{{resource}: "1"}}}} (or deploy the network-resources-injector)'))
    return resources, checks


def _device_check(snap: Snapshot, pod: Obj, subject: str, resource: str, count: int) -> Check:
    node_name = (pod.get("spec") or {}).get("nodeName")
    uid = (pod.get("metadata") or {}).get("uid")
    name = f"devices {resource}"
    if node_name:
        node = node_of(snap, node_name)
        alloc = quantity(((node or {}).get("status") or {}).get("allocatable", {}).get(
            resource, 0))
        if alloc == 0:
            return Check(subject, name, "warn",
                         f"scheduled on node {node_name}, which no longer advertises {resource}",
                         f"nicop diagnose node {node_name}")
        return Check(subject, name, "pass",
                     f"scheduled on node {node_name}, which has {alloc} {resource}")
    free = _free_devices(snap, resource, uid)
    if not free:
        return Check(subject, name, "fail",
                     f"the pod asks for {count} {resource}, and no node advertises {resource}: "
                     "the scheduler cannot place it (FailedScheduling: Insufficient "
                     f"{resource})", _no_such_resource_fix(snap, resource))
    fits = [(n, f, a) for n, f, a in free if f >= count]
    shown = ", ".join(f"{n} {f} of {a} free" for n, f, a in free[:5])
    if not fits:
        return Check(subject, name, "fail",
                     f"the pod asks for {count} {resource}, more than any node has free "
                     f"({shown})",
                     "wait for pods that use it to finish, lower the request, or raise the "
                     "count (rdmaHcaMax in the RDMA plugin config, numVfs in the "
                     "SriovNetworkNodePolicy)")
    return Check(subject, name, "pass",
                 f"{len(fits)} node(s) have {count} free {resource}: {shown}")


def _free_devices(snap: Snapshot, resource: str, uid: str | None) -> list[tuple[str, int, int]]:
    """(node, free, allocatable) of the nodes that advertise a resource, most free first."""
    out = []
    for node in snap.get("nodes") or []:
        alloc = quantity(((node.get("status") or {}).get("allocatable") or {}).get(
            resource, 0))
        if alloc <= 0:
            continue
        used = st.in_use(snap, st.name_of(node), exclude_uid=uid).get(resource, 0)
        out.append((st.name_of(node), max(0, alloc - used), alloc))
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


def _no_such_resource_fix(snap: Snapshot, resource: str) -> str:
    advertised = sorted({r for n in snap.get("nodes") or []
                         for r, v in ((n.get("status") or {}).get("allocatable") or {}).items()
                         if st.is_device_resource(r) and quantity(v) > 0})
    configured = sorted({r for names in st.configured_resources(st.policy_of(snap)).values()
                         for r in names})
    if resource in configured:
        return (f"the policy configures {resource} but no device plugin advertises it: run "
                "`nicop diagnose` for the nodes meant to have it")
    options = advertised or configured
    if options:
        return (f"request a resource that exists ({', '.join(options)}), or add {resource} to "
                "the device plugin config of the policy (resourcePrefix/resourceName)")
    return (f"configure a device plugin that advertises {resource} (rdmaSharedDevicePlugin or "
            "sriovDevicePlugin in the NicClusterPolicy)")


_SCHEDULING = re.compile(r"^\s*\d+/\d+ nodes are available:\s*(.*)$")
_INSUFFICIENT = re.compile(r"^(\d+) Insufficient (\S+)$")
_AFFINITY = re.compile(r"^(\d+) node\(s\) didn't match Pod's node affinity/selector$")
_TAINT = re.compile(r"^(\d+) node\(s\) had untolerated taint \{?(.*?)\}?$")
_UNSCHEDULABLE = re.compile(r"^(\d+) node\(s\) were unschedulable$")
# Parts of the scheduler's message that say nothing about this pod (dynamic resource claims).
_NOISE = frozenset({"no new claims to deallocate"})
_NAD_MISSING = re.compile(r"cannot find a network-attachment-definition \((.*?)\) in namespace "
                          r"\((.*?)\)")


def explain_event(snap: Snapshot, pod: Obj, event: Obj) -> tuple[str, str]:
    """An event in words, and what fixes it."""
    reason = str(event.get("reason", ""))
    message = str(event.get("message", "")).strip()
    namespace = (pod.get("metadata") or {}).get("namespace")
    name = (pod.get("metadata") or {}).get("name")
    if reason == "FailedScheduling" and (m := _SCHEDULING.match(message)):
        head = m.group(1).split("preemption:")[0]
        words, fixes = [], []
        for part in (p.strip().rstrip(".,") for p in re.split(r"[.,]\s+", head)):
            if not part or part in _NOISE:
                continue
            if i := _INSUFFICIENT.match(part):
                resource = i.group(2)
                advertised = _free_devices(snap, resource, None)
                if advertised:
                    words.append(f"{i.group(1)} node(s) have no free {resource} (all in use "
                                 "or fewer than requested)")
                    fixes.append(f"wait for pods using {resource} to finish or lower the "
                                 "request")
                else:
                    words.append(f"{i.group(1)} node(s) lack {resource}: no node advertises it")
                    fixes.append(_no_such_resource_fix(snap, resource))
            elif i := _AFFINITY.match(part):
                words.append(f"{i.group(1)} node(s) do not match the pod's nodeSelector or "
                             "node affinity")
                fixes.append("check spec.nodeSelector/affinity of the pod against the node "
                             "labels (kubectl get nodes --show-labels)")
            elif i := _TAINT.match(part):
                words.append(f"{i.group(1)} node(s) have a taint the pod does not tolerate "
                             f"({i.group(2)})")
                fixes.append("add a toleration to the pod, or remove the taint")
            elif i := _UNSCHEDULABLE.match(part):
                words.append(f"{i.group(1)} node(s) are cordoned (a driver upgrade cordons "
                             "nodes while it runs)")
                fixes.append("wait for the upgrade (nicop status), or kubectl uncordon <node>")
            elif part:
                words.append(part)
        text = "the scheduler placed it nowhere: " + "; ".join(words)
        return text, "; ".join(dict.fromkeys(fixes)) or f"kubectl -n {namespace} describe " \
                                                         f"pod {name}"
    if m := _NAD_MISSING.search(message):
        return (f"Multus found no NetworkAttachmentDefinition {m.group(2)}/{m.group(1)}: "
                f"{message}", f"create {m.group(2)}/{m.group(1)} or fix the pod's "
                f"{NETWORKS_ANNOTATION} annotation")
    if reason in ("FailedCreatePodSandBox", "FailedCreatePodSandbox"):
        return (f"the network could not be set up: {message}",
                f"the CNI's log on node {(pod.get('spec') or {}).get('nodeName')} tells more; "
                f"kubectl -n {namespace} describe pod {name}")
    return f"{reason}: {message}", f"kubectl -n {namespace} describe pod {name}"


def sorted_events(events: list[Obj]) -> list[Obj]:
    def when(e: Obj) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp")
                   or "")
    return sorted(events, key=when)


def _event_checks(snap: Snapshot, pod: Obj, subject: str) -> list[Check]:
    scheduled = bool((pod.get("spec") or {}).get("nodeName"))
    uid = (pod.get("metadata") or {}).get("uid")
    # Events of an earlier pod of the same name are not this pod's story.
    warnings = [e for e in sorted_events(snap.get("events") or [])
                if e.get("type") == "Warning"
                and (not uid or (e.get("involvedObject") or {}).get("uid") in (None, uid))]
    if not warnings:
        return [Check(subject, "events", "pass", "no warning events")]
    latest: dict[str, Obj] = {}
    for e in warnings:  # the newest of each reason tells the current story
        latest[str(e.get("reason"))] = e
    checks = []
    for reason, event in latest.items():
        if reason == "FailedScheduling" and scheduled:
            continue  # history: it has been placed since
        text, fix = explain_event(snap, pod, event)
        count = event.get("count") or 1
        running = (pod.get("status") or {}).get("phase") == "Running" and st.pod_ready(pod)
        checks.append(Check(subject, f"event {reason}", "warn" if running else "fail",
                            text + (f" ({count} times)" if count > 1 else ""), fix))
    return checks or [Check(subject, "events", "pass", "no current warning events")]


# The pod's checks, in the order they are shown.
registered("networks", "pod")(_networks)
registered("devices", "pod")(_devices)
registered("claims", "pod")(_claim_checks)
registered("events", "pod")(_event_checks)
