"""Administration: the admin HTTP API (/admin: keys, usage) and the key-management command
line, over the keys domain in `gateway.keys` and the reports of `gateway.usage_store`.

May import `gateway.keys`, `gateway.usage_store`, `gateway.config`, `gateway.observability`,
`gateway.server`, `gateway.errors`, `providers` and `plumbing`."""
