"""Development tools: the lab (network namespaces), devconsul (an embedded Consul-API
server) and the demo. Production code (agent, controller, consumers) never imports them,
and `make install` does not install them on a node (docs/operations.md)."""
