"""Administration: the admin HTTP API (/admin), the console in the browser (/admin/ui, in
`gateway.admin.console`) and the key-management command line, over the keys and usage domain
in `gateway.keys` and the usage store."""
