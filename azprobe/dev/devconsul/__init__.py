"""devconsul: an embedded server speaking Consul's HTTP API (KV, txn, sessions, status,
a small catalog) for the demo, the tests and laptops. Production talks to real Consul
through the same client code."""
