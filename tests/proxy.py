"""A reverse proxy on loopback between agents and their controller, for partition tests.

Requests are forwarded to the controller; those of a machine that is cut off (its name in
the path) are dropped: the connection is closed with no answer, as a lost network would.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class CuttableProxy:
    def __init__(self) -> None:
        self.upstream = ""
        self.cut: set[str] = set()
        self.dropped = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *_: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if any(f"/machines/{name}/" in self.path for name in proxy.cut):
                    proxy.dropped += 1
                    self.close_connection = True
                    return
                if not proxy.upstream:
                    self.send_error(502, "no upstream yet")
                    return
                target = urlsplit(proxy.upstream)
                conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                except OSError:
                    self.close_connection = True
                    return
                finally:
                    conn.close()
                if any(f"/machines/{name}/" in self.path for name in proxy.cut):
                    self.close_connection = True  # cut while it waited: the answer is lost too
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CuttableProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
