"""Unified API keys on Redis: records and secrets (`store`), budgets and rate limits
(`limiter`, Lua scripts under `lua/`), usage accounting (`usage`), the AccessControl
implementation (`access`), the admin HTTP API (`admin`) and its command line (`cli`)."""
