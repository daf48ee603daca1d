"""HTTP for the server tests: a free loopback port, an app served in this process, and
one request with its status and parsed answer (urllib, bounded waits)."""

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import uvicorn

REQUEST_TIMEOUT_S = 60  # the first forecast compiles the model


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, path: str, method: str = "GET", body: bytes | None = None):
    """(status, parsed JSON or text body, content type) of one request to 127.0.0.1."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            status, raw, ctype = r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("content-type", "")
    text = raw.decode()
    return status, json.loads(text) if ctype.startswith("application/json") else text, ctype


def post_json(port: int, path: str, payload):
    """`request` of a POST whose body is `payload` as JSON."""
    return request(port, path, "POST", json.dumps(payload).encode())


@contextlib.contextmanager
def serving(app, **config):
    """Serves `app` with uvicorn on a free loopback port in a thread; yields the port."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", **config)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()
