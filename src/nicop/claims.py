"""Why a pod's DRA claim is not allocated: which devices each request could take, node by node.

The scheduler says only that it "cannot allocate all claims". This reads the same inputs it
reads (the claim or its template, the DeviceClasses, the ResourceSlices and the devices other
claims hold) and finds, for each node, how many free devices each request could take and whether
a `matchAttribute` constraint can be met. A device with a taint the request does not tolerate
(NoSchedule or NoExecute) is not free, and is named with its taint. Selectors are CEL; the
equality tests DeviceClasses usually hold (`device.driver == "x"`,
`device.attributes["d"].a == "v"`, joined by `&&`) are evaluated, anything else is named as not
evaluated, so the counts are an upper bound.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nicop.kube.resources import quantity

Obj = dict[str, Any]
_DRIVER = re.compile(r'^device\.driver\s*==\s*"([^"]*)"$')
_ATTRIBUTE = re.compile(
    r'^device\.attributes\["([^"]+)"\]\.(\w+)\s*==\s*("[^"]*"|-?\d+|true|false)$')
_BARE = re.compile(r'^device\.attributes\["([^"]+)"\]\.(\w+)$')


@dataclass
class Request:
    """One request of a claim: the class and selectors its devices must pass, and how many."""

    name: str
    device_class: str
    count: int
    tests: list[str] = field(default_factory=list)  # CEL clauses to evaluate
    tolerations: list[Obj] = field(default_factory=list)
    capacity: dict[str, Any] = field(default_factory=dict)  # capacity.requests


@dataclass
class NodeFit:
    """A node's free devices per request, and whether the claim fits there."""

    node: str
    free: dict[str, int]  # request -> free devices that pass its tests
    total: dict[str, int]  # request -> devices that pass its tests, free or not
    fits: bool
    why: str


def requests_of(spec: Obj, classes: dict[str, Obj]) -> tuple[list[Request], list[str]]:
    """The claim spec's requests (a firstAvailable request by its first choice), and the CEL
    nicop could not evaluate."""
    out, unknown = [], []
    for request in (spec.get("devices") or {}).get("requests") or []:
        choice: Obj = request.get("exactly") or next(iter(request.get("firstAvailable") or []),
                                                     {})
        class_name = choice.get("deviceClassName", "")
        count = 0 if choice.get("allocationMode") == "All" else int(choice.get("count", 1))
        tests = []
        for selector in ((classes.get(class_name) or {}).get("spec") or {}).get(
                "selectors") or []:
            tests += _clauses(selector)
        for selector in choice.get("selectors") or []:
            tests += _clauses(selector)
        unknown += [t for t in tests if _evaluate(t, {}, "") is None]
        out.append(Request(request["name"], class_name, count, tests,
                           list(choice.get("tolerations") or []),
                           dict((choice.get("capacity") or {}).get("requests") or {})))
    return out, unknown


def _clauses(selector: Obj) -> list[str]:
    expression = " ".join(str((selector.get("cel") or {}).get("expression", "")).split())
    return [c.strip().strip("()").strip() for c in expression.split("&&") if c.strip()]


def _evaluate(clause: str, device: Obj, driver: str) -> bool | None:
    """True/False for the clauses understood, None otherwise."""
    if m := _DRIVER.match(clause):
        return driver == m.group(1)
    m = _ATTRIBUTE.match(clause) or _BARE.match(clause)
    if not m:
        return None
    value = _attribute(device, driver, m.group(1), m.group(2))
    if m.re is _BARE:
        return value is True
    wanted = m.group(3)
    literal: Any = wanted.strip('"') if wanted.startswith('"') else (
        wanted == "true" if wanted in ("true", "false") else int(wanted))
    return bool(value == literal)


def _attribute(device: Obj, driver: str, domain: str, name: str) -> Any:
    attributes = device.get("attributes") or {}
    typed = attributes.get(f"{domain}/{name}") or (attributes.get(name) if domain == driver
                                                   else None)
    if not typed:
        return None
    return next(iter(typed.values()))


def _passes(request: Request, device: Obj, driver: str) -> bool:
    return all(_evaluate(t, device, driver) is not False for t in request.tests)


def allocated(claims: Iterable[Obj]) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device some claim holds."""
    taken = set()
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
                   ).get("results") or []
        taken |= {(r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results}
    return taken


def consumed(claims: Iterable[Obj]) -> dict[tuple[str, str, str], dict[str, int]]:
    """(driver, pool, device) -> capacity name -> what the claims holding it consume, for the
    devices many claims share (allowMultipleAllocations)."""
    used: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
                   ).get("results") or []
        for r in results:
            for name, amount in (r.get("consumedCapacity") or {}).items():
                used[r.get("driver", ""), r.get("pool", ""), r.get("device", "")][name] += \
                    quantity(amount)
    return used


def room(device: Obj, used: dict[str, int], request: Request) -> list[str]:
    """What a shared device lacks for one more of `request` (`pods: 63 of 63 taken`)."""
    short = []
    for name, cap in (device.get("capacity") or {}).items():
        total = quantity(cap.get("value"))
        want = quantity(request.capacity.get(name) or (cap.get("requestPolicy") or {}).get(
            "default") or cap.get("value"))
        if used.get(name, 0) + want > total:
            short.append(f"{name}: {used.get(name, 0)} of {total} taken")
    return short


def _pool_of(s: Obj) -> tuple[str, str, int]:
    """(driver, pool name, generation) of a slice."""
    spec = s.get("spec") or {}
    pool = spec.get("pool") or {}
    return spec.get("driver", ""), pool.get("name", ""), int(pool.get("generation", 0))


def _newest(slices: Iterable[Obj]) -> list[Obj]:
    """The node-local slices of each pool's newest generation (the only one the scheduler
    reads)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = defaultdict(int)
    for s in slices:
        driver, pool, generation = _pool_of(s)
        newest[driver, pool] = max(newest[driver, pool], generation)
    return [s for s in slices if (s.get("spec") or {}).get("nodeName")
            and newest[_pool_of(s)[:2]] == _pool_of(s)[2]]


def node_devices(slices: Iterable[Obj]) -> dict[str, list[tuple[str, str, Obj]]]:
    """node -> (driver, pool, device) from the newest generation of each node-local pool."""
    out: dict[str, list[tuple[str, str, Obj]]] = defaultdict(list)
    for s in _newest(slices):
        driver, pool, _ = _pool_of(s)
        out[s["spec"]["nodeName"]] += [(driver, pool, d) for d in s["spec"].get("devices") or []]
    return out


Counter = tuple[str, str, str, str]  # driver, pool, counter set, counter


def held_by_others(slices: Iterable[Obj], taken: set[tuple[str, str, str]]
                   ) -> set[tuple[str, str, str]]:
    """Devices no claim holds that cannot be had anyway, because the devices claims hold have
    used up the counters they share (as the scheduler counts): a PF while some of its VFs are
    allocated, its VFs while the PF is."""
    slices = list(slices)
    left: dict[Counter, int] = {}
    for s in _newest(slices):
        driver, pool, _ = _pool_of(s)
        for counter_set in s["spec"].get("sharedCounters") or []:
            for counter, value in (counter_set.get("counters") or {}).items():
                left[driver, pool, counter_set.get("name", ""), counter] = quantity(
                    value.get("value"))

    def consumption(driver: str, pool: str, device: Obj) -> dict[Counter, int]:
        return {(driver, pool, c.get("counterSet", ""), counter): quantity(value.get("value"))
                for c in device.get("consumesCounters") or []
                for counter, value in (c.get("counters") or {}).items()}

    devices = [d for on_node in node_devices(slices).values() for d in on_node]
    for driver, pool, device in devices:
        if (driver, pool, device["name"]) in taken:
            for key, amount in consumption(driver, pool, device).items():
                left[key] = left.get(key, 0) - amount
    return {(driver, pool, device["name"]) for driver, pool, device in devices
            if (driver, pool, device["name"]) not in taken
            and any(amount > left.get(key, 0)
                    for key, amount in consumption(driver, pool, device).items())}


def fits(spec: Obj, classes: dict[str, Obj], slices: Iterable[Obj],
         claims: Iterable[Obj]) -> tuple[list[Request], list[NodeFit], list[str]]:
    """Each node's free devices for the claim's requests and whether all of them (and the
    claim's matchAttribute constraints) can be met there; and the CEL not evaluated."""
    requests, unknown = requests_of(spec, classes)
    slices = list(slices)
    claims = list(claims)
    taken = allocated(claims)
    used = consumed(claims)
    shared = held_by_others(slices, taken)
    taken |= shared

    def available(driver: str, pool: str, device: Obj, request: Request) -> bool:
        if untolerated(device, request.tolerations):
            return False
        if device.get("allowMultipleAllocations"):
            return not room(device, used.get((driver, pool, device["name"]), {}), request)
        return (driver, pool, device["name"]) not in taken

    constraints = [c for c in (spec.get("devices") or {}).get("constraints") or []
                   if c.get("matchAttribute")]
    result = []
    for node, devices in sorted(node_devices(slices).items()):
        matching = {r.name: [(drv, d) for drv, pool, d in devices if _passes(r, d, drv)]
                    for r in requests}
        free = {r.name: [(drv, d) for drv, pool, d in devices if _passes(r, d, drv)
                         and available(drv, pool, d, r)] for r in requests}
        short = [r for r in requests if len(free[r.name]) < max(r.count, 1)]
        why = ""
        if short:
            why = "; ".join(f"{r.name}: {len(free[r.name])} free of {len(matching[r.name])} "
                            f"{r.device_class}, {max(r.count, 1)} wanted"
                            + _shared_note(devices, r, shared) + _taint_note(devices, r)
                            + _full_note(devices, r, used) for r in short)
        else:
            why = _constraint_problem(constraints, requests, free)
        result.append(NodeFit(node, {k: len(v) for k, v in free.items()},
                              {k: len(v) for k, v in matching.items()}, not why, why))
    return requests, result, unknown


def _shared_note(devices: list[tuple[str, str, Obj]], request: Request,
                 shared: set[tuple[str, str, str]]) -> str:
    """Names the devices held only through their shared counters, which users do not see
    allocated in any claim."""
    held = sorted(d["name"] for drv, pool, d in devices
                  if (drv, pool, d["name"]) in shared and _passes(request, d, drv))
    if not held:
        return ""
    return (f" ({', '.join(held)} not free: a PF is not free while some of its VFs are "
            "allocated, nor its VFs while it is)")


def untolerated(device: Obj, tolerations: list[Obj]) -> list[str]:
    """The device's taints that keep the request off it (`key=value:effect`)."""
    return [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
            for t in device.get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
            and not any(_tolerates(tol, t) for tol in tolerations)]


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    """As a pod's toleration matches a node taint: empty effect or key match all."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and \
        toleration.get("value", "") == taint.get("value", "")


def _taint_note(devices: list[tuple[str, str, Obj]], request: Request) -> str:
    """Names the devices the request's tolerations keep it off, with their taints."""
    tainted = [f"{d['name']} tainted {', '.join(taints)}" for drv, pool, d in devices
               if _passes(request, d, drv) and (taints := untolerated(d, request.tolerations))]
    return f" ({'; '.join(sorted(tainted))})" if tainted else ""


def _full_note(devices: list[tuple[str, str, Obj]], request: Request,
               used: dict[tuple[str, str, str], dict[str, int]]) -> str:
    """Names the shared devices whose capacity the claims holding them have used up."""
    full = [f"{d['name']} full, {', '.join(short)}" for drv, pool, d in devices
            if d.get("allowMultipleAllocations") and _passes(request, d, drv)
            and (short := room(d, used.get((drv, pool, d["name"]), {}), request))]
    return f" ({'; '.join(sorted(full))})" if full else ""


def _constraint_problem(constraints: list[Obj], requests: list[Request],
                        free: dict[str, list[tuple[str, Obj]]]) -> str:
    """Why no value of a matchAttribute gives every request of the constraint enough devices."""
    for constraint in constraints:
        attribute = constraint["matchAttribute"]
        domain, _, name = attribute.rpartition("/")
        names = constraint.get("requests") or [r.name for r in requests]
        wanted = {r.name: max(r.count, 1) for r in requests if r.name in names}
        counts: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for request in wanted:
            for driver, device in free[request]:
                value = _attribute(device, driver, domain, name)
                if value is not None:
                    counts[value][request] += 1
        if not any(all(by_request[r] >= n for r, n in wanted.items())
                   for by_request in counts.values()):
            return (f"no {attribute} value has free devices for all of "
                    f"{', '.join(sorted(wanted))}")
    return ""
