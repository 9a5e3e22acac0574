"""Transport security shared by every part: the one TLS context builder (tls.py)."""
