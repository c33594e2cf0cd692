"""The console's web application under /admin/ui: sign-in, sessions, CSRF and headers.

Contract:
  - Every page and fragment needs a live session (the `gw_console` cookie); without one a page
    redirects to the sign-in page and a fragment (`X-Console-Fragment: 1`) answers 401.
  - Sign-in takes the admin key (compared in constant time, as the admin API does; a user key
    gets nothing) and is rate-limited per client address. The key is never stored in the
    browser nor logged: the cookie holds a random token whose hash names the session in Redis.
  - Every POST carries the session's CSRF token (form field `csrf` or header `X-CSRF-Token`)
    and, when the browser sends one, a same-origin `Origin`; anything else is 403.
  - Every change (POST) answers 303 to a GET page (post/redirect/get): a reload never repeats
    it. What that page must show once (a secret, a refused form) travels through `Handoff`.
    Refused POSTs change nothing and answer their status (403 cross-origin or stale token;
    401 or 429 for a sign-in).
  - Every answer carries the security headers of `render.SECURITY_HEADERS`, `/admin/ui`
    (sent to `/admin/ui/`) and unknown `/admin/ui/...` paths ("no such page") included.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import jinja2
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.admin.console.handoff import Handoff
from gateway.admin.console.render import SECURITY_HEADERS, Static, environment, html
from gateway.admin.console.sessions import LoginLimiter, Session, SessionStore
from gateway.admin.console.summaries import Summaries
from gateway.config.settings import Settings
from gateway.keys.store import KeyStore
from gateway.resources import REDIS

log = structlog.get_logger("gateway.admin.console")

COOKIE = "gw_console"
SESSIONS = web.AppKey("console_sessions", SessionStore)
LIMITER = web.AppKey("console_login_limiter", LoginLimiter)
KEYS = web.AppKey("console_key_store", KeyStore)
SUMMARIES = web.AppKey("console_summaries", Summaries)
TEMPLATES = web.AppKey("console_templates", jinja2.Environment)
STATIC = web.AppKey("console_static", Static)
ADMIN_KEY = web.AppKey("console_admin_key", bytes)
HANDOFF = web.AppKey("console_handoff", Handoff)
SESSION = web.RequestKey("console_session", Session)  # the request's live session
PUBLIC = frozenset({"/admin/ui/login"})

View = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Answer(Exception):  # noqa: N818 (not an error: a page raised from deep in a view)
    """A finished console page, raised by a helper of a view (a revoked key's page, say)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def is_https(request: web.Request) -> bool:
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return forwarded == "https" or request.scheme == "https"


def session_of(request: web.Request) -> Session:
    session: Session = request[SESSION]
    return session


def page(request: web.Request, template: str, status: int = 200, **context: object) -> web.Response:
    """A console page (or fragment) with the context every template uses."""
    session: Session | None = request.get(SESSION)
    return html(
        request.app[TEMPLATES],
        template,
        status=status,
        csrf=session.csrf if session else "",
        path=request.path,
        **context,
    )


def _fragment(request: web.Request) -> bool:
    return request.headers.get("X-Console-Fragment") == "1"


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    scheme = "https" if is_https(request) else request.scheme
    return origin in (f"{scheme}://{request.host}", f"{request.scheme}://{request.host}")


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Security headers, sessions and CSRF (see the module)."""
    try:
        response = await _guarded(request, handler)
    except Answer as answer:
        response = answer.response
    except web.HTTPException as exc:  # redirects and 404s raised by the views
        exc.headers.update(SECURITY_HEADERS)
        exc.headers.setdefault("Cache-Control", "no-store")
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


def see_other(location: str) -> web.Response:
    """A 303 to `location` (returned, so that the caller may set cookies on it)."""
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/admin/ui/static/"):
        return await handler(request)
    if request.method == "POST" and not _same_origin(request):
        return page(request, "error.jinja", status=403, message="Cross-origin request refused.")
    if request.path in PUBLIC:
        return await handler(request)
    session = await request.app[SESSIONS].get(request.cookies.get(COOKIE))
    if session is None:
        if _fragment(request) or request.method != "GET":
            return web.Response(
                status=401, text="Sign in first.", headers={"Cache-Control": "no-store"}
            )
        target = request.rel_url.path_qs if request.method == "GET" else "/admin/ui/"
        raise web.HTTPSeeOther(
            location=str(request.app.router["login"].url_for().with_query(next=target))
        )
    request[SESSION] = session
    if request.method == "POST":
        form = await request.post()
        sent = request.headers.get("X-CSRF-Token") or form.get("csrf") or ""
        if not isinstance(sent, str) or not hmac.compare_digest(
            sent.encode(), session.csrf.encode()
        ):
            return page(
                request,
                "error.jinja",
                status=403,
                message="Missing or stale form token: reload the page and try again.",
            )
    return await handler(request)


def _next(value: str | None) -> str:
    """Where to go after sign-in: a console path only (never another site)."""
    if value and value.startswith("/admin/ui/") and "//" not in value and "\\" not in value:
        return value
    return "/admin/ui/"


async def login_form(request: web.Request) -> web.Response:
    return page(request, "login.jinja", next=_next(request.query.get("next")), error=None)


async def login(request: web.Request) -> web.StreamResponse:
    client = request.remote or "unknown"
    allowed, retry_s = await request.app[LIMITER].allow(client)
    form = await request.post()
    target = _next(str(form.get("next", "")))
    if not allowed:
        log.warning("console_login_rate_limited", client=client)
        response = page(
            request,
            "login.jinja",
            status=429,
            next=target,
            error=f"Too many sign-in attempts: try again in {retry_s} s.",
        )
        response.headers["Retry-After"] = str(retry_s)
        return response
    presented = str(form.get("admin_key", "")).strip().encode("utf-8", "surrogateescape")
    if not presented or not hmac.compare_digest(presented, request.app[ADMIN_KEY]):
        log.warning("console_login_refused", client=client)
        return page(
            request, "login.jinja", status=401, next=target, error="That is not the admin key."
        )
    token, _ = await request.app[SESSIONS].create()
    log.info("console_login", client=client)
    response = see_other(target)
    response.set_cookie(
        COOKIE,
        token,
        max_age=request.app[SESSIONS].ttl_s,
        path="/admin/ui",
        httponly=True,
        samesite="Strict",
        secure=is_https(request),
    )
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    sessions = request.app[SESSIONS]
    form = await request.post()
    if form.get("everywhere") == "1":
        ended = await sessions.revoke_all()
        log.info("console_sessions_revoked", sessions=ended)
    else:
        await sessions.revoke(request.cookies.get(COOKIE, ""))
    response = see_other("/admin/ui/login")
    response.del_cookie(COOKIE, path="/admin/ui")
    return response


async def static(request: web.Request) -> web.Response:
    return request.app[STATIC].response(request.match_info["digest"], request.match_info["name"])


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther(location="/admin/ui/overview")


async def bare(request: web.Request) -> web.StreamResponse:
    """`/admin/ui` (the address the docs give, without its slash): the console's home."""
    raise web.HTTPSeeOther(
        location="/admin/ui/", headers={**SECURITY_HEADERS, "Cache-Control": "no-store"}
    )


async def no_such_page(request: web.Request) -> web.StreamResponse:
    return page(
        request,
        "error.jinja",
        status=404,
        heading="No such page",
        message=f"There is no console page at {request.path}.",
    )


def handoff_of(request: web.Request) -> tuple[Handoff, str]:
    """The hand-off store and the name of this request's session in it."""
    return request.app[HANDOFF], session_of(request).token_hash


def setup_console(app: web.Application, settings: Settings) -> None:
    """Mount the console on `app` at /admin/ui (with `[admin] console` and an admin key)."""
    admin = settings.admin
    if not admin.console or admin.api_key is None:
        return
    from gateway.admin.console import keys_pages, live_page, usage_pages

    console = web.Application(middlewares=[guard])
    console[ADMIN_KEY] = admin.api_key.get_secret_value().encode()
    static_files = Static()
    console[STATIC] = static_files
    console[TEMPLATES] = environment(static_files)
    console[live_page.RATES] = live_page.Rates()
    console[SUMMARIES] = Summaries()
    prefix = settings.redis.key_prefix

    async def open_services(_: web.Application) -> None:
        redis = app[REDIS]
        console[SESSIONS] = SessionStore(
            redis,
            prefix,
            admin.api_key.get_secret_value() if admin.api_key else "",
            admin.session_ttl_s,
        )
        console[LIMITER] = LoginLimiter(redis, prefix, admin.login_attempts_per_minute)
        console[HANDOFF] = Handoff(redis, prefix)
        console[KEYS] = KeyStore(redis, prefix=prefix)

    console.on_startup.append(open_services)
    console.add_routes(
        [
            web.get("/", home),
            web.get("/login", login_form, name="login"),
            web.post("/login", login),
            web.post("/logout", logout),
            web.get("/static/{digest}/{name}", static),
            *keys_pages.routes(),
            *usage_pages.routes(),
            *live_page.routes(),
            web.route("*", "/{tail:.*}", no_such_page),  # last: what no route above took
        ]
    )
    app.router.add_get("/admin/ui", bare)  # before the console: its prefix would take it
    app.add_subapp("/admin/ui", console)
