"""Who may ask and what it cost: the access-control contract the pipeline calls
(`contract`: authenticate, admit, settle) and the open implementation for `auth.enabled = false`
(`open`). The Redis-backed implementation (keys, budgets, limits, usage) is `gateway.keys`.

May import `gateway.routing.policy` (a key's policy), `gateway.config`, `gateway.errors`,
`providers` and `plumbing`."""
