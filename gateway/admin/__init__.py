"""Administration: the admin HTTP API (/admin) and the key-management command line, over the
keys and usage domain in `gateway.keys`."""
