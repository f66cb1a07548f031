"""The console as an ASGI app (Starlette, Jinja2 templates, no script at all).

Pages and their JSON twins under ``/api/`` read through one read-only ledger
opened at start-up (for a SQLite file, the read-only reader: a console
without actions never writes the file). Actions open a writing ledger for
their one verb and close it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataoad._console.actions import ACTIONS, ActionRefused, run_action, verifier_for
from dataoad._console.data import audit_page, held_by_a_live_lease, queue, receipt_json
from dataoad._console.security import COOKIE, HEADERS, Sessions, same_secret
from dataoad._errors import InvalidArgumentError
from dataoad._identity import check_namespace

__all__ = ["ConsoleSettings", "build_app"]

_HERE: Final = Path(__file__).parent
_ACTION_ID: Final = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass(frozen=True)
class ConsoleSettings:
    """How the console reaches the ledger and who may do what."""

    open_reader: Callable[[], Any]
    open_writer: Callable[[], Awaitable[Any]]
    #: A SQLite file is read afresh for each request: a reader opened once
    #: would go on showing the file as it was (a writer may change it).
    reader_per_request: bool
    token: str | None
    allow_actions: bool
    verifiers: Any = None
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]")


def _visible(text: object) -> str:
    """Control characters shown as ``\\xNN``, so a stored string cannot forge a line."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(text))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


class SecurityHeaders:
    """Adds the console's security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])]
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def build_app(settings: ConsoleSettings) -> Starlette:
    """The console for ``settings``."""
    # Every stored string is the ledger's callers' or operators': escape all of it.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")), autoescape=True
    )
    env.filters["visible"] = _visible
    env.filters["age"] = _age
    # JSON escapes control characters itself; only the indent's newlines stay.
    env.filters["json_block"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    templates = Jinja2Templates(env=env)
    sessions = Sessions()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not settings.reader_per_request:
            state["ledger"] = settings.open_reader()
        try:
            yield
        finally:
            if "ledger" in state:
                await state.pop("ledger").close()

    @contextlib.asynccontextmanager
    async def reading() -> AsyncIterator[Any]:
        if not settings.reader_per_request:
            yield state["ledger"]
            return
        ledger = settings.open_reader()
        try:
            yield ledger
        finally:
            await ledger.close()

    def csrf_of(request: Request) -> str | None:
        return sessions.csrf(request.cookies.get(COOKIE))

    def allowed(request: Request) -> bool:
        if settings.token is None:
            return True  # loopback and read-only: no token to ask for
        if csrf_of(request) is not None:
            return True
        bearer = request.headers.get("authorization", "")
        return bearer.startswith("Bearer ") and same_secret(bearer[7:], settings.token)

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        context = {
            **context,
            "csrf": csrf_of(request),
            "actions": settings.allow_actions,
            "token": settings.token is not None,
        }
        response: Response = templates.TemplateResponse(request, name, context, status_code=status)
        return response

    def refuse(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status)
        return page(request, "message.html", {"title": "Refused", "message": message}, status)

    def guarded(view: Callable[[Request], Awaitable[Response]]) -> Any:
        async def endpoint(request: Request) -> Response:
            if not allowed(request):
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": "log in or send the token"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
            return await view(request)

        return endpoint

    def namespace_of(request: Request) -> str | None:
        raw = request.query_params.get("namespace")
        return None if raw is None else check_namespace(raw)

    def page_of(request: Request) -> int:
        raw = request.query_params.get("page", "1")
        # isdigit() alone passes "²", which int() refuses.
        return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) <= 100_000 else 1

    async def queue_data(request: Request) -> Any:
        async with reading() as ledger:
            return await queue(ledger, namespace=namespace_of(request), page=page_of(request))

    async def queue_page(request: Request) -> Response:
        try:
            found = await queue_data(request)
        except InvalidArgumentError as problem:
            return refuse(request, 400, str(problem))
        return page(request, "queue.html", {"queue": found})

    async def queue_api(request: Request) -> Response:
        try:
            found = await queue_data(request)
        except InvalidArgumentError as problem:
            return refuse(request, 400, str(problem))
        return JSONResponse(found.to_json())

    async def receipt_data(request: Request) -> tuple[Any, dict[str, Any]] | None:
        action_id = request.path_params["action_id"]
        if not _ACTION_ID.match(action_id):
            return None
        async with reading() as ledger:
            receipt = await ledger.get(action_id)
        if receipt is None:
            return None
        return receipt, receipt_json(receipt)

    async def receipt_page(request: Request) -> Response:
        found = await receipt_data(request)
        if found is None:
            return refuse(request, 404, "no receipt with this action id")
        receipt, data = found
        can_verify = verifier_for(settings.verifiers, receipt.action_name) is not None
        async with reading() as ledger:
            live = await held_by_a_live_lease(ledger, receipt)
        return page(
            request,
            "receipt.html",
            {**data, "can_verify": can_verify and not live, "live_lease": live},
        )

    async def receipt_api(request: Request) -> Response:
        found = await receipt_data(request)
        if found is None:
            return refuse(request, 404, "no receipt with this action id")
        return JSONResponse(found[1])

    async def audit_data(request: Request) -> dict[str, Any]:
        operator = request.query_params.get("operator") or None
        async with reading() as ledger:
            return await audit_page(ledger, operator=operator, page=page_of(request))

    async def audit_html(request: Request) -> Response:
        try:
            found = await audit_data(request)
        except InvalidArgumentError as problem:  # an operator name no one can have
            return refuse(request, 400, str(problem))
        return page(request, "audit.html", {"audit": found})

    async def audit_api(request: Request) -> Response:
        try:
            return JSONResponse(await audit_data(request))
        except InvalidArgumentError as problem:
            return refuse(request, 400, str(problem))

    async def act(request: Request) -> Response:
        if not settings.allow_actions:
            return refuse(request, 403, "this console is read-only (dataoad serve --allow-actions)")
        csrf = csrf_of(request)
        if csrf is None:
            return refuse(request, 403, "log in with the console's token first")
        form = await request.form()
        given = form.get("csrf")
        if not isinstance(given, str) or not same_secret(given, csrf):
            return refuse(
                request, 403, "the form's CSRF token is missing or wrong; reload the page"
            )
        action = request.path_params["action"]
        found = await receipt_data(request)
        if action not in ACTIONS or found is None:
            return refuse(request, 404, "no such receipt or action")
        receipt = found[0]
        fields = {k: form.get(k) for k in ("operator", "reason")}
        if not all(isinstance(v, str) for v in fields.values()):
            return refuse(request, 400, "operator and reason are required")
        try:
            said = await run_action(
                settings.open_writer,
                action,
                receipt,
                operator=str(fields["operator"]),
                reason=str(fields["reason"]),
                verifiers=settings.verifiers,
            )
        except ActionRefused as problem:
            return refuse(request, 409, str(problem))
        link = f"/receipts/{receipt.action_id}"
        return page(request, "message.html", {"title": "Done", "message": said, "link": link})

    async def login_form(request: Request) -> Response:
        if settings.token is None:
            return RedirectResponse("/", status_code=303)
        return page(request, "login.html", {})

    async def login(request: Request) -> Response:
        form = await request.form()
        given = form.get("token")
        if (
            settings.token is None
            or not isinstance(given, str)
            or not same_secret(given, settings.token)
        ):
            return refuse(request, 401, "wrong token")
        session, _ = sessions.start()
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return response

    async def logout(request: Request) -> Response:
        csrf = csrf_of(request)
        form = await request.form()
        given = form.get("csrf")
        if csrf is None or not isinstance(given, str) or not same_secret(given, csrf):
            return refuse(request, 403, "the form's CSRF token is missing or wrong")
        sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    routes = [
        Route("/", guarded(queue_page)),
        Route("/receipts/{action_id}", guarded(receipt_page)),
        Route("/receipts/{action_id}/{action}", act, methods=["POST"]),
        Route("/audit", guarded(audit_html)),
        Route("/api/queue", guarded(queue_api)),
        Route("/api/receipts/{action_id}", guarded(receipt_api)),
        Route("/api/audit", guarded(audit_api)),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts)),
    ]
    return Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={Exception: _server_error},
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette answers an unexpected error outside every middleware, so the
    # security headers are added here too; the error itself is not shown.
    return PlainTextResponse("internal error", status_code=500, headers=HEADERS)
