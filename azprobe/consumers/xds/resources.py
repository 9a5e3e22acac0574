"""The xDS resources azprobe serves, as the official Envoy v3 protos (PyPI xds-protos).

Per service NAME:
- ClusterLoadAssignment NAME: the shared rendering (azprobe.consumers.localities);
- Listener NAME with an api_listener HttpConnectionManager whose routes come by RDS,
  RouteConfiguration NAME sending every request to Cluster NAME, and Cluster NAME of
  type EDS over ADS: the chain a proxyless gRPC client asks for `xds:///NAME`.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.any_pb2 import Any
from google.protobuf.wrappers_pb2 import UInt32Value

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from azprobe.consumers.localities import Locality

TYPE_PREFIX = "type.googleapis.com/"
LISTENER = TYPE_PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = TYPE_PREFIX + "envoy.config.route.v3.RouteConfiguration"
CLUSTER = TYPE_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = TYPE_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
TYPES = (LISTENER, ROUTE, CLUSTER, ENDPOINT)
# SotW: an empty list of names means "all of them" for these types (the xDS protocol's
# wildcard); RDS and EDS are always asked for by name.
WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})
HCM_TYPE = TYPE_PREFIX + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER_TYPE = TYPE_PREFIX + "envoy.extensions.filters.http.router.v3.Router"


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                          resource_api_version=config_source_pb2.V3)


def cluster_load_assignment(service: str, plan: Sequence[Locality]) -> endpoint_pb2.ClusterLoadAssignment:
    """The plan as a ClusterLoadAssignment; `plan` is never empty (plan_localities)."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=service)
    for loc in plan:
        lle = cla.endpoints.add(locality=base_pb2.Locality(zone=loc.zone),
                                load_balancing_weight=UInt32Value(value=loc.weight), priority=loc.priority)
        for host, port in loc.endpoints:
            # a named sick host: Envoy and gRPC use it only when the healthy ones are not enough
            status = health_check_pb2.DEGRADED if (host, port) in loc.degraded else health_check_pb2.UNKNOWN
            address = address_pb2.Address(socket_address=address_pb2.SocketAddress(address=host, port_value=port))
            lle.lb_endpoints.append(endpoint_components_pb2.LbEndpoint(
                health_status=status, endpoint=endpoint_components_pb2.Endpoint(address=address)))
    return cla


def listener(service: str) -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager(
        rds=hcm_pb2.Rds(config_source=_ads(), route_config_name=service),
        http_filters=[hcm_pb2.HttpFilter(name="envoy.filters.http.router",
                                         typed_config=pack(router_pb2.Router()))])
    return listener_pb2.Listener(name=service, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def route_configuration(service: str) -> route_pb2.RouteConfiguration:
    route = route_components_pb2.Route(match=route_components_pb2.RouteMatch(prefix=""),
                                       route=route_components_pb2.RouteAction(cluster=service))
    return route_pb2.RouteConfiguration(name=service, virtual_hosts=[
        route_components_pb2.VirtualHost(name=service, domains=["*"], routes=[route])])


def cluster(service: str) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=service, type=cluster_pb2.Cluster.EDS, lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=_ads(), service_name=service),
        # Envoy applies locality weights only with this; gRPC always does.
        common_lb_config=cluster_pb2.Cluster.CommonLbConfig(
            locality_weighted_lb_config=cluster_pb2.Cluster.CommonLbConfig.LocalityWeightedLbConfig()))


def pack(message: object) -> Any:
    packed = Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed
