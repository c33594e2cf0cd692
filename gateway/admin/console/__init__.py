"""The admin console in the browser, at /admin/ui: server-rendered pages over the admin API's
own functions (keys, the usage store, readiness, cluster membership), sessions in Redis."""
