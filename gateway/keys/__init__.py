"""Unified API keys on Redis: records and secrets (`store`), budgets and rate limits
(`limiter`, Lua scripts under `lua/`, batched by `script_batch` and `script_channel`), usage
accounting (`usage`), durable settlement (`keeper`, `spool`) and the AccessControl
implementation over them (`redis_access`).

May import `gateway.access.contract`, `gateway.routing.policy`, `gateway.usage_store.pricing`,
`gateway.config`, `gateway.errors`, `gateway.observability`, `providers` and `plumbing`."""
