"""The request path after parsing: route, admit, call a provider with fallback, encode, settle
(`pipeline`), what is kept of the event stream (`event_tally`), how many output tokens a request
reserves (`output_limits`) and prompt-token estimates for admission (`prompt_estimates`).

May import every `gateway` package but `server` and `admin`, and `providers`, `plumbing`."""
