"""The contracts between the parts of the loop: window, weights document and KV layout,
model-input stats, the sketch. Imports nothing else of azprobe (docs/contracts.md)."""
