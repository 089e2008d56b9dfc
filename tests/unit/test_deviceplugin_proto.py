"""The checked-in gRPC modules match api.proto, and speak the kubelet's v1beta1 API."""

from __future__ import annotations

from pathlib import Path

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import protogen


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    fresh = protogen.generate(tmp_path)
    stale = [path.name for path, text in fresh.items() if path.read_text() != text]
    assert not stale, (f"{', '.join(stale)} differ from their .proto; "
                       "run `python -m nicop.node.deviceplugin.protogen`")


def test_method_paths_and_field_names_are_the_kubelets() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    fields = {
        name: [(f.name, f.number) for f in msg.fields]
        for name, msg in pb.DESCRIPTOR.message_types_by_name.items()
    }
    assert fields["Device"] == [("ID", 1), ("health", 2), ("topology", 3)]
    assert fields["ContainerPreferredAllocationRequest"] == [
        ("available_deviceIDs", 1), ("must_include_deviceIDs", 2), ("allocation_size", 3)]
    assert fields["ContainerAllocateRequest"] == [("devices_ids", 1)]
    assert fields["ContainerAllocateResponse"] == [
        ("envs", 1), ("mounts", 2), ("devices", 3), ("annotations", 4), ("cdi_devices", 5)]
    assert fields["RegisterRequest"] == [
        ("version", 1), ("endpoint", 2), ("resource_name", 3), ("options", 4)]
