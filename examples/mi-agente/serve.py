"""mi-agente's app: an HTTP server with the standard library only, answering without a model key.

The Rayito agent host starts it with ``python serve.py`` from the copied code, gives it its port
in ``$PORT`` (``port_env``), waits for ``GET /health`` and, with ``protocol = "json"``, turns each
``POST /invocations`` into a ``POST /invoke`` ``{"prompt": ...}`` and the ``answer`` field of the
reply into the invocation's text. A prompt ``sleep <seconds>`` answers that much later: a long
session, to watch the fleet's queue and its parked slots at work.
"""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("PORT", "9100"))
GREETING = os.environ.get("GREETING", "Hola")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        else:
            self._reply(404, {"error": "not_found"})

    def do_POST(self):
        if self.path != "/invoke":
            self._reply(404, {"error": "not_found"})
            return
        length = int(self.headers.get("Content-Length", 0))
        prompt = json.loads(self.rfile.read(length) or b"{}").get("prompt", "")
        if prompt.startswith("sleep "):
            try:
                seconds = float(prompt.split()[1])
            except (IndexError, ValueError):
                seconds = 0.0
            if 0 < seconds <= 600:  # NaN, negative or huge: no sleep, an answer at once
                time.sleep(seconds)
        self._reply(200, {"answer": f"{GREETING}: {prompt}"})

    def _reply(self, status, body):
        payload = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
