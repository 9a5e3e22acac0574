"""`azprobe scheduler-extender`: the weights as a kube-scheduler extender (protocol v1).

protocol (the wire types, bounded parsing), zones (node -> zone), scoring (the pure
decision), config (the TOML loader), server (the HTTP shell and the command).
"""
