"""Administration: the admin HTTP API (/admin: keys, usage), the console in the browser
(/admin/ui, `gateway.admin.console`) and the key-management command line, over the keys domain
in `gateway.keys` and the reports of `gateway.usage_store`.

May import `gateway.keys`, `gateway.usage_store`, `gateway.routing` and `gateway.cluster` (the
console's live view), `gateway.config`, `gateway.observability`, `gateway.server`,
`gateway.errors`, `providers` and `plumbing`."""
