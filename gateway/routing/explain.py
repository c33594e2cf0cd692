"""`x-gateway-route`: every routed answer says where it went and why.

Format: `; `-separated `name=value` fields, in this order (optional ones only when they apply):
  provider=<provider>; model=<provider-side model>; thinking=on|off; reason=<reason>
  [; score=<0.00-1.00>] [; client=refused] [; cached=<tokens>]
  [; kept=prefix | overflow=queue|context] [; skipped=<p1>,<p2>]
  [; shadow_thinking=on|off; shadow_reason=<reason>[; shadow_score=<score>]] [; panic=1]
  [; node=<cluster node>; prefix=<cached>/<reusable blocks>; via=local|forward|fallback
     [; tried=<unreachable node>]] [; account=<i>/<n>]
`skipped` names the providers of routes passed over (an open breaker, or a 429's back-off);
`panic=1`: every route was open and this one was tried anyway (panic mode, breaker.py).
Reasons: policy:off, policy:on, client, route, default, rule:<name>@<version>, sticky, model
(the learned scorer; `score` then says its score).
`cached`, `kept` and `overflow` are an auto model's local-or-upstream choice (local_first.py):
how many of the prompt's leading tokens the local engine held in its prefix cache, and why the
local engine kept the request beyond its queue allowance or passed it over.
The last fields come from the provider that served the request (its `Placed` events): the local
engine says which cluster node ran the prompt and how much of it was cached there; an upstream
with several accounts says which one the conversation keeps to. A provider reports them as soon as
it decides (before it sends the request on), so stream headers that go out before the first
token carry them too; the access log records the final value (a forward that fell back).
`thinking=off` also stands for "the provider's default" (DeepSeek-V3.1's is off).
"""

from __future__ import annotations

from aiohttp import web

from gateway.routing.aliases import Route
from gateway.routing.decide import Decision

HEADER = "x-gateway-route"
ROUTE = web.RequestKey("gateway_route", str)
# Where the provider of the route being opened placed the request, until it is appended to
# ROUTE (its first answer) or dropped (it failed).
PLACEMENT = web.RequestKey("gateway_route_placement", str)


def on_off(thinking: bool | None) -> str:
    return "on" if thinking else "off"


def explain(decision: Decision, route: Route, skipped: list[str]) -> str:
    fields = [
        f"provider={route.provider_name}",
        f"model={route.model}",
        f"thinking={on_off(decision.thinking_for(route))}",
        f"reason={decision.reason_for(route)}",
    ]
    if decision.score is not None:
        fields.append(f"score={decision.score:.2f}")
    fields.extend(decision.notes)
    if skipped:
        fields.append("skipped=" + ",".join(skipped))
    shadow = decision.shadow
    if shadow is not None:
        fields.append(f"shadow_thinking={on_off(shadow.thinking)}")
        fields.append(f"shadow_reason={shadow.reason}")
        if shadow.score is not None:
            fields.append(f"shadow_score={shadow.score:.2f}")
    return "; ".join(fields)


def watch_placement(request: web.Request, placement: str | None) -> None:
    """The placement the provider of the route being opened reported (None: that route
    failed): headers sent before its first answer carry it."""
    if placement is None:
        request.pop(PLACEMENT, None)
    else:
        request[PLACEMENT] = placement


def note_placement(request: web.Request) -> None:
    """The route answered: its placement (if its provider reported one) joins the route."""
    placement = request.pop(PLACEMENT, None)
    route = request.get(ROUTE)
    if placement and route:
        request[ROUTE] = f"{route}; {placement}"


async def add_route_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the request's route (when it got one) on its answer, errors too;
    with the placement of the route still opening, when its provider reported one."""
    value = request.get(ROUTE)
    placement = request.get(PLACEMENT)
    if value and placement:
        value = f"{value}; {placement}"
    if value:
        response.headers[HEADER] = value
