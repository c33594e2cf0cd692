"""Transport to upstreams: a lean HTTP/1.1 client (`http1`, `http1_connection`,
`http1_response`; its bounds and errors in `http1_bounds`), an incremental server-sent-events
parser (`sse`) and one-timer read deadlines (`read_deadline`).

May import `providers.errors` and `plumbing`; nothing of `gateway` or `backend`."""
