"""`azprobe xds`: the weights as an xDS management server (docs/dataplane.md).

One module per job: `resources` (the protos, pure, from the shared rendering),
`snapshot` (the resources of every view and their digests), `streams` (what one
SotW or delta stream has been sent and what it needs next, pure), `sources`
(endpoints: static files or the Consul catalog), `config` (the TOML loader), `server`
(the gRPC shell), `metrics` and `main` (the command).
"""
