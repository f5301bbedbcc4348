"""A real S3-compatible server for tests: moto's server on loopback, with fault injection.

:class:`FaultyS3Server` is moto's ``ThreadedMotoServer`` whose WSGI app is wrapped by
:class:`Faults`: rules that fail (an S3 error response) or delay requests whose method and
path match, counting every request they hit.  Clients (the driver in this process and the
Spark Python workers) reach it over HTTP on 127.0.0.1 through ordinary s3fs.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass

BUCKET = "cutline-test"


@dataclass
class Rule:
    method: str
    pattern: re.Pattern
    status: int | None = None  # respond with this S3 error status
    delay: float = 0.0         # then (or only) wait this long
    times: int | None = None   # apply to the first this many matching requests only
    hits: int = 0


class Faults:
    """WSGI middleware: apply the first matching rule, else pass the request to moto."""

    def __init__(self, app) -> None:
        self.app = app
        self.rules: list[Rule] = []
        self.lock = threading.Lock()

    def add(self, method: str, pattern: str, *, status: int | None = None,
            delay: float = 0.0, times: int | None = None) -> Rule:
        rule = Rule(method, re.compile(pattern), status, delay, times)
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def __call__(self, environ, start_response):
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        with self.lock:
            rule = next((r for r in self.rules
                         if r.method == method and r.pattern.search(path)
                         and (r.times is None or r.hits < r.times)), None)
            if rule is not None:
                rule.hits += 1
        if rule is None:
            return self.app(environ, start_response)
        if rule.delay:
            time.sleep(rule.delay)
        if rule.status is None:
            return self.app(environ, start_response)
        stream = environ["wsgi.input"]  # drain the body: the connection is kept alive
        length = environ.get("CONTENT_LENGTH")
        stream.read(int(length)) if length else stream.read()
        code = {403: "AccessDenied", 503: "SlowDown"}.get(rule.status, "InternalError")
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected fault</Message><RequestId>{uuid.uuid4().hex}</RequestId>"
                "</Error>").encode()
        start_response(f"{rule.status} Injected", [("Content-Type", "application/xml"),
                                                   ("Content-Length", str(len(body)))])
        return [body]


def start_server():
    """Start moto's S3 server on 127.0.0.1 (a free port) behind :class:`Faults`."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication, MotoRequestHandler, create_backend_app)
    from werkzeug.serving import make_server

    class FaultyS3Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            self.faults = Faults(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, self.faults, True,
                                       request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = FaultyS3Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return server


class S3:
    """What a test needs: endpoint, fsspec options, fresh prefixes, fault rules."""

    def __init__(self, server) -> None:
        self.server = server
        host, port = server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.faults: Faults = server.faults
        self.options = {
            "endpoint_url": self.endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
            # fail fast: one retry, then the error reaches the caller
            "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"},
                              "connect_timeout": 5, "read_timeout": 30},
        }
        import boto3  # (moto depends on it)
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)

    def url(self, name: str) -> str:
        """A fresh ``s3://`` prefix for one test."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"

    def fs(self):
        from cutline.storage.fs import url_to_fs
        return url_to_fs(f"s3://{BUCKET}", self.options)[0]
