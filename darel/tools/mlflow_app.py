"""The MLflow server that `make mlflow-ui` starts: MLflow's own app, whose start page sets
the browser's defaults for a store of training runs before MLflow's UI reads them.

MLflow 3's UI keeps some choices in the browser's local storage, with defaults made for
GenAI work: on its first page load on 127.0.0.1 it opens the "MLflow Assistant" side panel
(about a quarter of the window), an experiment opens on its GenAI overview, and the GenAI
page's "Detect Issues" guidance covers every button until dismissed. This store holds
training runs only, so the start page (the one HTML page of MLflow's single-page UI)
carries a short script that, before the UI starts:

* marks the assistant's first-load opening as done (the panel stays closed unless the
  person opens it; their later choice is kept);
* makes "Model training" the default workflow where the browser has none yet;
* marks the "Detect Issues" guidance as seen where it was not;
* closes the assistant panel when the page opened is one of this project's table views
  (``viewStateShareKey=darel-...``), so the table is whole at once;
* where the server's telemetry is off (MLFLOW_DISABLE_TELEMETRY, which the Makefile and
  darel.tracking set), marks the home page's notice that MLflow collects usage data as
  read and the UI's own telemetry setting as off, where the browser has no choice of its
  own. MLflow shows that notice to every browser that has not closed it, whatever the
  server's setting; with telemetry off the server collects nothing from the UI anyway.

Nothing else changes: every request goes to MLflow's app, which applies its own checks,
and only the start page's HTML gets the script. Registered as the MLflow app ``darel-ui``
(pyproject.toml, entry point group ``mlflow.app``), started with ``mlflow ui --app-name
darel-ui``."""

from __future__ import annotations

import json
import os
from typing import Any, Awaitable, Callable

from darel.tracking import table_view_key

# MLflow 3.x's local-storage keys (its useLocalStorage hook stores JSON under "<key>_v<version>").
ASSISTANT_AUTO_OPENED = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
ASSISTANT_PANEL_OPEN = "mlflow.assistant.panelOpen_v1"
WORKFLOW_TYPE = "mlflow.workflowType_v1"
DETECT_ISSUES_SEEN = "mlflow.detectIssues.guidanceShown_v1"

# The home page's "Information about UI telemetry" notice, closed; the settings page's switch.
TELEMETRY_NOTICE_CLOSED = "mlflow.telemetry.info.alert.dismissed_v1"
UI_TELEMETRY_ENABLED = "mlflow.settings.telemetry.enabled_v1"

# Set only where the browser holds no value of its own.
DEFAULTS = {ASSISTANT_AUTO_OPENED: True, WORKFLOW_TYPE: "machine_learning", DETECT_ISSUES_SEEN: True}
TELEMETRY_OFF_DEFAULTS = {TELEMETRY_NOTICE_CLOSED: True, UI_TELEMETRY_ENABLED: False}
# What every table view's address holds, whatever the profile: the part all view keys share
# ("darel-"). Not table_view_key(""): an empty name slugs to "experiment", and a marker
# "darel-experiment" matched no view, so the assistant panel was never closed on one.
VIEW_MARKER = "viewStateShareKey=" + os.path.commonprefix([table_view_key("a"), table_view_key("b")])


def defaults_script(telemetry_off: bool = False) -> str:
    """The script placed first in the start page's <head>."""
    chosen = {**DEFAULTS, **(TELEMETRY_OFF_DEFAULTS if telemetry_off else {})}
    defaults = json.dumps({key: json.dumps(value) for key, value in chosen.items()})
    return ("<script>(function(){try{var s=window.localStorage,d=" + defaults + ";"
            "for(var k in d){if(s.getItem(k)===null){s.setItem(k,d[k]);}}"
            "if(window.location.hash.indexOf(" + json.dumps(VIEW_MARKER) + ")>=0){s.setItem("
            + json.dumps(ASSISTANT_PANEL_OPEN) + ",'false');}}catch(e){}})();</script>")


Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class TrainingDefaults:
    """An ASGI app: MLflow's ``inner`` app, the start page's HTML with ``defaults_script``
    placed first in its <head>. A class instance, not a function: MLflow treats a function
    named by ``--app-name`` as a factory."""

    def __init__(self, inner: Callable[[Scope, Receive, Send], Awaitable[None]], prefix: str = "",
                 telemetry_off: bool = False) -> None:
        self.inner = inner
        self.start_page = prefix.rstrip("/") + "/"
        self.script = defaults_script(telemetry_off).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") != self.start_page:
            await self.inner(scope, receive, send)
            return
        # The whole page is rewritten, so no cached copy (or 304) may stand in for it.
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"if-none-match",
                                                                                     b"if-modified-since")]
        start: Message = {}
        body: list[bytes] = []

        async def collect(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            head, page = self._with_script(start, b"".join(body))
            await send(head)
            await send({"type": "http.response.body", "body": page})

        await self.inner({**scope, "headers": headers}, receive, collect)

    def _with_script(self, start: Message, page: bytes) -> tuple[Message, bytes]:
        headers = [(k.lower(), v) for k, v in start.get("headers", [])]
        kind = dict(headers).get(b"content-type", b"")
        encoded = dict(headers).get(b"content-encoding", b"identity") not in (b"identity", b"")
        if start.get("status") == 200 and kind.startswith(b"text/html") and not encoded and b"<head>" in page:
            page = page.replace(b"<head>", b"<head>" + self.script, 1)
            headers = [(k, v) for k, v in headers if k not in (b"content-length", b"etag", b"last-modified",
                                                                b"cache-control")]
            headers += [(b"content-length", str(len(page)).encode()), (b"cache-control", b"no-cache")]
        return {**start, "headers": headers}, page


def _build() -> TrainingDefaults:
    from mlflow.server import fastapi_app
    from mlflow.server.handlers import STATIC_PREFIX_ENV_VAR
    from mlflow.telemetry.utils import is_telemetry_disabled  # what the server's UI telemetry endpoint asks

    return TrainingDefaults(fastapi_app.app, os.environ.get(STATIC_PREFIX_ENV_VAR, ""),
                            telemetry_off=is_telemetry_disabled())


def __getattr__(name: str) -> Any:
    # `app` is built on first use: importing this module (tests, the entry point's listing)
    # must not build MLflow's server app.
    if name == "app":
        globals()["app"] = built = _build()
        return built
    raise AttributeError(name)
