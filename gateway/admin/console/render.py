"""Templates and static files of the console: the Jinja2 environment (autoescaped), static
files addressed by a digest of their content (cached for a year), and the security headers
every console answer carries (a strict Content-Security-Policy: no inline script or style)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
STATIC_FILES = ("console.css", "console.js", "uPlot.iife.min.js", "uPlot.min.css")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" would make form posts send `Origin: null`
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
CONTENT_TYPES = {".css": "text/css", ".js": "text/javascript"}


class Static:
    """The console's static files, read once: name -> (digest, bytes)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bytes]] = {}
        for name in STATIC_FILES:
            body = (STATIC_DIR / name).read_bytes()
            self.files[name] = (hashlib.sha256(body).hexdigest()[:12], body)

    def url(self, name: str) -> str:
        return f"/admin/ui/static/{self.files[name][0]}/{name}"

    def response(self, digest: str, name: str) -> web.Response:
        found = self.files.get(name)
        if found is None or found[0] != digest:
            raise web.HTTPNotFound()
        return web.Response(
            body=found[1],
            content_type=CONTENT_TYPES[Path(name).suffix],
            charset="utf-8",
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )


def _when(value: Any) -> str:
    """A moment as `YYYY-MM-DD HH:MM:SS` UTC (epoch ms, a datetime or an ISO string)."""
    if value is None or value == "":
        return "—"
    if isinstance(value, int | float):
        moment = datetime.fromtimestamp(value / 1000, UTC)
    elif isinstance(value, str):
        moment = datetime.fromisoformat(value)
    else:
        moment = value
    return str(moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def _money(value: Any) -> str:
    return "—" if value is None else f"{float(value):,.4f}"


def environment(static: Static) -> jinja2.Environment:
    """The templates, every one compiled here (about 50 ms at start), so that no page's first
    view after a start pays for its compiling; they are package files, not reloaded."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        cache_size=-1,  # never drop a compiled template
    )
    env.globals["static"] = static.url
    env.filters["when"] = _when
    env.filters["number"] = _number
    env.filters["money"] = _money
    for name in env.list_templates():
        env.get_template(name)
    return env


def html(env: jinja2.Environment, template: str, status: int = 200, **context: Any) -> web.Response:
    body = env.get_template(template).render(**context)
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )
