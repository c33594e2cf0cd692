"""The local-engine provider: the embedded DeepSeek-V3.1 engine behind the Provider contract.

`provider` turns a ChatRequest into prompt ids and engine output into Events (`stream`);
`setup` finds or builds the checkpoint and starts the engine; `engine_client` is what the
provider needs of an engine, wherever it runs: in this process, on a peer (`remote_engine`) or
in worker 0 of this node (`worker_engine`).

May import `providers` (the contract), `providers.transport`, `plumbing` and `backend`; never
`gateway`."""
