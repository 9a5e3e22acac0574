"""Clients of the other parts: the HTTP transport, the agent's windows API, Consul."""
