"""The contract between the gateway and whatever answers a request, and its producers.

The contract comes first: `types` (the normalized `ChatRequest` and the `Event`s a provider
yields), `base` (the `Provider` protocol) and `errors` (what a provider raises). Then the
producers: `upstream/` (HTTP upstreams), `local/` (the embedded engine) and `transport/` (the
HTTP/1.1 client and SSE parsing they use).

May import `plumbing` and `backend`; never `gateway`."""
