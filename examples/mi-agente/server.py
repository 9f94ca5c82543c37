"""mi-agente: a tiny agent over HTTP, standard library only.

The MicroVM proxy sends traffic to port 8080. ``GET /ping`` is the health check; ``POST
/invocations`` takes ``{"prompt": "...", "session_id": "..."}`` and answers with a greeting that
remembers how many turns the session had, which is enough to see session affinity work.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GREETING = os.environ.get("GREETING", "Hola")
MAX_BODY = 1 << 20
_turns: dict[str, int] = {}
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server_version = "mi-agente/1"

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/ping":
            self._send(200, {"status": "Healthy"})
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/invocations":
            self._send(404, {"error": "not_found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(413, {"error": "too_large"})
            return
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": "invalid_json"})
            return
        session = str(request.get("session_id") or "default")
        with _lock:
            _turns[session] = _turns.get(session, 0) + 1
            turn = _turns[session]
        prompt = str(request.get("prompt", ""))
        self._send(200, {"text": f"{GREETING}! ({turn}) {prompt}", "session_id": session})

    def log_message(self, fmt: str, *args: object) -> None:
        print(json.dumps({"path": self.path, "status": args[1] if len(args) > 1 else None}), flush=True)


def main() -> None:
    port = int(os.environ.get("PORT", "8080"))
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
