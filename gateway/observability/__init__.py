"""Logs and metrics: structlog set-up (`logging`), the per-request log fields
(`log_context`), credentials masked in URLs (`redact`), Prometheus metrics (`metrics`,
`metric_types`) and the local engine's gauges (`engine_metrics`).

May import `gateway.config`, `providers` and `plumbing`."""
