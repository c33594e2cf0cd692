"""The request path after parsing: route, admit, call a provider, encode, settle (`pipeline`),
route by route with the breakers until one answers (`fallback`), what is kept of the event
stream (`event_tally`), how many output tokens a request reserves (`output_limits`) and
prompt-token estimates for admission (`prompt_estimates`).

May import `gateway.access.contract`, `gateway.config`, `gateway.observability`, `gateway.routing`,
`gateway.server` (the SSE writer), `gateway.wire`, `gateway.errors`, `providers` and `plumbing`."""
