"""Device plugin figures on a simulated DGX (8 ConnectX-7, 64 VFs), over real unix sockets.

- Allocate latency, p50/p99, as the kubelet stand-in sees it, for the RDMA shared plugin (all
  eight HCAs) and the SR-IOV plugin (one VF with its RDMA devices and device-info file). Reference:
  GetDevicePluginOptions on the same socket, a gRPC round trip that does no work.
- Time from a link change in sysfs to the updated ListAndWatch message at the kubelet. Reference:
  the poll interval (the upstream plugins never send one: they have no health check).
- The cost of one rescan of the host, which bounds how short the poll interval can be.

Run: .venv/bin/python bench/bench_deviceplugin.py [--rounds 500] [--poll 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import api_pb2_grpc as pb_grpc
from nicop.node.deviceplugin.rdma import RdmaAgent, load_config
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop.node.discovery import scan
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet

RDMA = "rdma/hca_shared_devices_a"
VF = "nvidia.com/sriov_ib_vf"


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


async def timed(rounds: int, call: object) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await call()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return samples


async def run(rounds: int, poll: float, flips: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    try:
        host = SimulatedHost.build(root, "dgx")
        for pf in host.pfs():
            host.set_numvfs(pf, 8)
        (root / "rdma.json").write_text(json.dumps({"configList": [
            {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000,
             "selectors": {"linkTypes": ["infiniband"], "deviceIDs": ["1021"]}}]}))
        (root / "sriov.json").write_text(json.dumps({"resourceList": [
            {"resourceName": "sriov_ib_vf", "resourcePrefix": "nvidia.com",
             "selectors": {"devices": ["101e"], "isRdma": True}}]}))
        sockdir = host.path(DEVICE_PLUGIN_PATH)
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(RdmaAgent(load_config(root / "rdma.json"), host, sockdir,
                                          poll_interval=poll).run(stop)),
            asyncio.create_task(SriovAgent(root / "sriov.json", host, sockdir,
                                           poll_interval=poll).run(stop)),
        ]
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA: 1000, VF: 64}, 30)

        channel = kubelet.resources[VF].channel
        stub = pb_grpc.DevicePluginStub(channel)
        reference = await timed(rounds, lambda: stub.GetDevicePluginOptions(pb.Empty()))
        rdma = await timed(rounds, lambda: kubelet.allocate(RDMA, ["7"]))
        sriov = await timed(rounds, lambda: kubelet.allocate(VF, ["0000:dc:00.3"]))
        print(f"Allocate over a unix socket ({rounds} calls each)      p50        p99")
        print(f"  GetDevicePluginOptions (reference)      {ms(pct(reference, 50))} "
              f"{ms(pct(reference, 99))}")
        for name, samples in (("RDMA shared, 8 HCAs", rdma), ("SR-IOV, 1 VF + device-info", sriov)):
            ratio = statistics.median(samples) / statistics.median(reference)
            print(f"  {name:<38}  {ms(pct(samples, 50))} {ms(pct(samples, 99))}"
                  f"   {ratio:4.1f}x the reference")

        changes: list[float] = []
        seen = asyncio.Event()
        kubelet.on_update = lambda name, devices: seen.set() if name == RDMA else None
        for i in range(flips):
            up = i % 2 == 1
            await asyncio.sleep(random.uniform(0, poll))  # links change at any time in a tick
            seen.clear()
            start = time.perf_counter()
            host.set_link("ibp154s0", up)
            await asyncio.wait_for(seen.wait(), 5)
            changes.append(time.perf_counter() - start)
        print(f"Link change -> ListAndWatch update at the kubelet ({flips} flips, poll {poll}s)")
        print(f"  p50 {ms(pct(changes, 50))}   p99 {ms(pct(changes, 99))}   max {ms(max(changes))}"
              f"   p50 = {statistics.median(changes) / poll:.2f}x the poll interval "
              "(upstream: no update, ever)")

        scans = []
        for _ in range(50):
            start = time.perf_counter()
            scan(host)
            scans.append(time.perf_counter() - start)
        print(f"One rescan of the host (8 PFs, 64 VFs): p50 {ms(pct(scans, 50))}, "
              f"{statistics.median(scans) / poll * 100:.1f}% of the poll interval")

        stop.set()
        await asyncio.gather(*tasks)
        await kubelet.close()
    finally:
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--flips", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("nicop").setLevel(logging.ERROR)  # the health changes are the point
    asyncio.run(run(args.rounds, args.poll, args.flips))


if __name__ == "__main__":
    main()
