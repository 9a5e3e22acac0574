"""Readers of the weights in Consul KV: the CLI, the watcher library, Envoy file-EDS, explain."""
