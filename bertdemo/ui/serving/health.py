"""`GET /healthz`: whether this process serves a model, for a load balancer or an orchestrator
(Docker's HEALTHCHECK, Kubernetes' readinessProbe, nginx's passive checks in deploy/).

    200 "ok: <model>"                        the model loaded
    503 "no model: <why>"                    it did not; the page says why too

and a second line with the disk caches' use against their budget ("cache 312.4 of 2,000 MB used").

A *replica* (one of several processes behind a balancer, `--replica`) that has no model also
answers the page itself ("/" and "/config") with that 503: nginx then tries the next replica and
stops sending visitors to this one for a while (`max_fails`), where a lone process would rather
show its visitors the page and the reason.
"""
from __future__ import annotations

from starlette.responses import PlainTextResponse

PAGE_PATHS = ("/", "/config", "/gradio_api/info")  # what a browser or gradio_client asks first


class Health:
    """ASGI middleware in front of the Gradio app; `store` is the app's `SessionStore`."""

    def __init__(self, app, store, replica: bool = False, disk=None):
        """`disk`: the engine's `disk.DiskCache`, whose use the answer says (none: not said)."""
        self.app, self.store, self.replica, self.disk = app, store, replica, disk

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else None
        # HEAD / is Gradio's own "is localhost reachable" check at launch: it must pass
        refuse = self.replica and self.store.base is None and path in PAGE_PATHS and scope["method"] != "HEAD"
        if path == "/healthz" or refuse:
            await self.answer()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def answer(self) -> PlainTextResponse:
        cache = f"{self.disk.line()}\n" if self.disk is not None else ""
        if self.store.base is None:
            why = self.store.load_error or "no model is loaded"
            return PlainTextResponse(f"no model: {why}\n{cache}", status_code=503)
        return PlainTextResponse(f"ok: {self.store.base.name}\n{cache}")
