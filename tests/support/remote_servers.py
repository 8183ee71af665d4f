"""Servers on loopback for the tests of files read by URL: nginx (the system package), moto's S3
in server mode, and a small HTTP server of our own for the faults nginx does not make.

Each counts what it serves on its own side: nginx in its access log (one line per request:
method, path, status, body bytes sent, the Range asked), moto and ours in counters.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

NGINX_CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format counted '$request_method $uri $status $body_bytes_sent "$http_range"';
    access_log {prefix}/access.log counted;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    types {{ }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: Optional[subprocess.Popen] = None, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


class Nginx:
    """nginx serving ``root`` on 127.0.0.1 from its own temporary prefix, with an access log of
    what it sent (:meth:`requests`)."""

    def __init__(self, binary: str):
        self.prefix = Path(tempfile.mkdtemp(prefix="hurray-nginx-"))
        self.root = self.prefix / "www"
        self.root.mkdir()
        self.port = free_port()
        config = self.prefix / "nginx.conf"
        config.write_text(NGINX_CONFIG.format(prefix=self.prefix, root=self.root, port=self.port))
        self.log = self.prefix / "access.log"
        self.process = subprocess.Popen([binary, "-p", str(self.prefix), "-c", str(config), "-e",
                                         str(self.prefix / "error.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port(self.port, self.process)
        except RuntimeError as exc:
            error = self.process.stderr.read().decode(errors="replace") if self.process.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"{exc}: {error}") from None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def requests(self, name: Optional[str] = None) -> list[tuple[str, int, int, str]]:
        """``(method, status, body bytes, range)`` of every request served so far (of ``/name`` only)."""
        out = []
        if not self.log.exists():
            return out
        for line in self.log.read_text().splitlines():
            method, uri, status, sent, asked = line.split(" ", 4)
            if name is None or uri == f"/{name}":
                out.append((method, int(status), int(sent), asked.strip('"')))
        return out

    def requests_since(self, name: str, before: int, at_least: int = 1,
                       seconds: float = 5.0) -> list[tuple[str, int, int, str]]:
        """The requests for ``/name`` after the first ``before`` ones, once at least ``at_least`` of
        them are logged: nginx writes a request's log line after it sent the response, so a client
        can look before the line is there (bounded by ``seconds``)."""
        deadline = time.monotonic() + seconds
        while True:
            served = self.requests(name)[before:]
            if len(served) >= at_least or time.monotonic() > deadline:
                return served
            time.sleep(0.01)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


class CountingMoto:
    """moto's S3 in server mode on 127.0.0.1, counting the GETs of objects and their body bytes."""

    def __init__(self):
        from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app

        counts = self.counts = {"get": 0, "bytes": 0}
        lock = threading.Lock()

        def counting(app):
            def wrapped(environ, start_response):
                body = app(environ, start_response)
                if environ["REQUEST_METHOD"] == "GET" and environ.get("HTTP_RANGE"):
                    data = b"".join(body)
                    with lock:
                        counts["get"] += 1
                        counts["bytes"] += len(data)
                    return [data]
                return body
            return wrapped

        class Server(ThreadedMotoServer):
            def _server_entry(self) -> None:
                from werkzeug.serving import make_server

                self._server = make_server(self._ip_address, self._port,
                                           counting(DomainDispatcherApplication(create_backend_app)), True)
                self._server_ready_event.set()
                self._server.serve_forever()

        self.server = Server(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options = {"key": "testing", "secret": "testing", "use_listings_cache": False,
                        "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def stop(self) -> None:
        self.server.stop()


class FaultServer:
    """A threaded HTTP server on 127.0.0.1 serving ``files`` (name -> bytes) with range requests,
    made to misbehave by ``fault``: ``truncate`` (a 206 cut short, then the connection closed),
    ``error`` (500), ``ignore_range`` (200 and the whole file), ``hang`` (no answer), ``replace``
    (after ``replace_after`` GETs the file is ``replacement``: another ETag, maybe another size;
    ``If-Match`` is ignored, as by a server that does not know it).  A request for several ranges is
    answered with the whole file (no ``multipart/byteranges``), as some servers do."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.fault: Optional[str] = None
        self.replacement: Optional[bytes] = None
        self.replace_after = 0
        self.gets = 0
        self.bytes_sent = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _content(self):
                name = self.path.lstrip("/")
                data = server.files.get(name)
                if data is not None and server.fault == "replace" and server.gets > server.replace_after:
                    data = server.replacement
                return data

            def _etag(self, data: bytes) -> str:
                return f'"{len(data):x}-{hash(data) & 0xFFFFFFFF:x}"'

            def do_HEAD(self):
                data = self._content()
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", self._etag(data))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self):
                server.gets += 1
                data = self._content()
                if data is None:
                    self.send_error(404)
                    return
                if server.fault == "error":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if server.fault == "hang":
                    time.sleep(5)
                    self.close_connection = True
                    return
                asked = self.headers.get("Range", "")
                if server.fault == "ignore_range" or not asked.startswith("bytes=") or "," in asked:
                    # several ranges: the whole file, as a server without multi-range support answers
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("ETag", self._etag(data))
                    self.end_headers()
                    self._send(data)
                    return
                first, _, last = asked[len("bytes="):].partition("-")
                first, last = int(first), min(int(last), len(data) - 1)
                body = data[first: last + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", self._etag(data))
                self.end_headers()
                if server.fault == "truncate":
                    self._send(body[: len(body) // 2])
                    self.close_connection = True
                    return
                self._send(body)

            def _send(self, body: bytes) -> None:
                server.bytes_sent += len(body)
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that gave up on a misbehaving answer is what the tests want

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
