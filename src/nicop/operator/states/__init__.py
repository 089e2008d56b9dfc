"""The component states of a NicClusterPolicy, in the order upstream runs them."""

from nicop.operator.states import (
    cni_plugins,
    doca_telemetry,
    dra_driver,
    ib_kubernetes,
    ipoib,
    multus,
    nic_configuration_operator,
    nic_feature_discovery,
    nv_ipam,
    ofed,
    rdma_dp,
    spectrum_x_operator,
    sriov_dp,
)
from nicop.operator.states.base import State

STATES: tuple[State, ...] = (
    multus.STATE,
    cni_plugins.STATE,
    ipoib.STATE,
    ofed.STATE,
    sriov_dp.STATE,
    rdma_dp.STATE,
    ib_kubernetes.STATE,
    nv_ipam.STATE,
    nic_feature_discovery.STATE,
    doca_telemetry.STATE,
    nic_configuration_operator.STATE,
    spectrum_x_operator.STATE,
    dra_driver.STATE,
)
