"""The four APIs on the wire: each parses its requests into a `ChatRequest`
(`chat_request`, `responses_request`, `messages_request`, with their `bounds`) and encodes a
provider's `Event`s as its own frames (`chat_response`, `completion_response`,
`responses_response`, `messages_response`); `base` is what an encoder is, `messages_errors` and
`messages_tokens` the Messages API's error shape and token counting, `thinking_signature` the
signatures on the thinking blocks it returns.

May import `gateway.access.contract` (the contract), `gateway.pipeline.prompt_estimates`,
`gateway.routing`, `gateway.config`, `gateway.errors`, `providers` and `plumbing`."""
