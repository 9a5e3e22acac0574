"""Daemon plumbing shared by the agent and the controller: systemd notify, address files."""
