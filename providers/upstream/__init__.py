"""Upstream providers: OpenAI-compatible (`openai`) and Anthropic Messages (`anthropic`)
servers reached over HTTP, their wire formats (`openai_wire`, `anthropic_wire`), settings
(`config`), error mapping (`errors`), the model list and health check (`model_listing`) and
account affinity (`affinity`).

May import `providers` (the contract), `providers.transport` and `plumbing`; never `gateway`."""
