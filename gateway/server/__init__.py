"""Serving processes and the HTTP edge: one process (`serve`) or several (`workers`), the
aiohttp runner with parser errors in the API shape (`http_server`, aiohttp hooks in
`aiohttp_hooks`), middleware (request id, access log, error rendering), request bodies with a
deadline (`request_body`), SSE responses kept alive (`sse_stream`) and the Redis connection with
its embedded fallback (`redis_server`).

May import the app factory (to serve it), the app's resource keys (`gateway.resources`),
`gateway.config`, `gateway.observability`, `gateway.routing` (readiness reads the breakers),
`gateway.wire`, `gateway.errors`, `providers` and `plumbing`."""
