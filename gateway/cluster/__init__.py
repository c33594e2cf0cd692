"""Several nodes (gateway + engine) sharing one Redis: the prefix-cache index published and
followed through Redis (`publisher`, `follower`, `index`, `events`), liveness and load
(`node`, `join`), placement of a turn where its prefix is cached (`scoring`, `placer`), and the
internal endpoint peers and workers call (`internal`).

May import `gateway.config`, `gateway.server`, `gateway.errors`, `gateway.observability`,
`providers`, `plumbing` and `backend`'s torch-free engine types."""
