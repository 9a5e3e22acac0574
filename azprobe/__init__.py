"""azprobe: per-AZ TCP health from eBPF, turned into safe routing weights in Consul KV."""

__version__ = "0.1.0"
