"""The operator's commands: the CLI entry point, doctor, top, trace."""
