"""Hosting the embedded engine: open it in this process as a provider (`embedded`), and share
worker 0's engine with the other serving processes of this node (`worker_share`).

May import `gateway.cluster`, `gateway.config`, `gateway.observability`, `gateway.server`,
`gateway.errors`, `providers` and `plumbing`."""
