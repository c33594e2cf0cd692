"""The one typed, frozen settings object: `settings` (the root model, TOML + environment),
with the `[providers]` and `[models]` tables and their presets (`providers`), and the
`[engine]` (`engine`), `[routing]` (`routing`), `[cluster]` (`cluster`) and `[usage]` (`usage`)
sections in modules of their own, as are the process's `[server]`, `[redis]` and `[logging]`
(`process`).

May import `providers` value types and `plumbing`; nothing else of `gateway`."""
