"""The HTTP front door: the app factory (`app`), handlers, the error hierarchy (`errors`), the
OpenAPI document, the command line, and the packages by concern: `config`, `server`,
`observability`, `access` and `keys`, `pipeline`, `routing`, `wire`, `cluster`, `engine_host`,
`usage_store`, `admin`.

May import `providers`, `plumbing` and (for the embedded engine) `backend`; nothing imports the
app module."""
