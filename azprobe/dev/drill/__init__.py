"""`azprobe lab drill`: the chaos drill on user traffic through a real Envoy, side by side
for static weights, Envoy's outlier detection and azprobe (docs/dataplane.md)."""
