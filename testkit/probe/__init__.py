"""The client-behaviour probe (`scripts/probe.py`): a staged gateway with broken upstreams and
private Redis, and the checks it runs through real clients (wire, SDK, faults)."""
