"""What the recipe writer's tests talk to, over real sockets:

* :class:`CloudFormationEndpoint`: CloudFormation's pre-signed response endpoint
  (``https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com``) as a local TLS
  server with a certificate for that host from a test CA, reached through a local CONNECT proxy.
  The writer runs unchanged: ``HTTPS_PROXY`` sends it to the proxy, ``SSL_CERT_FILE`` makes it
  trust the test CA, and it still checks the host and the certificate as in AWS.
* :class:`FaultProxy`: a plain HTTP proxy in front of moto that counts every request by operation
  (what the store saw, not what the writer says it did) and answers chosen operations with the
  error AWS would send (``ThrottlingException``, ``InvalidKeyId``...) for a number of times.
* :func:`write_recipe`: the writer's entry point run as CloudFormation's Create of one fleet's
  recipe resource, against moto's S3 and SSM and a :class:`CloudFormationEndpoint`.
"""

from __future__ import annotations

import datetime
import http.client
import json
import select
import socket
import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CFN_HOST = "cloudformation-custom-resource-response-useast1.s3.amazonaws.com"
TIMEOUT = 10


def _certificate(subject: str, issuer_key: Any, issuer: Optional[x509.Name], key: Any, *, ca: bool, host: Optional[str]):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False), critical=True)
    if host:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_ca_and_server(folder: Path, host: str = CFN_HOST) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for ``host``: (ca.pem, server.pem, server.key)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("rayito test CA", ca_key, None, ca_key, ca=True, host=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(host, ca_key, ca.subject, key, ca=False, host=host)
    ca_pem, cert_pem, key_pem = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return ca_pem, cert_pem, key_pem


class _Responses(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.attempts += 1  # type: ignore[attr-defined]
        if self.server.unavailable > 0:  # type: ignore[attr-defined]
            self.server.unavailable -= 1  # type: ignore[attr-defined]
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.received.append({"host": self.headers.get("Host"), "path": self.path, "body": json.loads(body)})  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Connect(BaseHTTPRequestHandler):
    """CONNECT host:443 → the local TLS server; anything else is refused (and recorded)."""

    def do_CONNECT(self) -> None:  # noqa: N802
        self.server.tunnels.append(self.path)  # type: ignore[attr-defined]
        host, _, port = self.path.rpartition(":")
        target = self.server.targets.get((host, int(port)))  # type: ignore[attr-defined]
        if target is None:
            self.send_response(403)
            self.end_headers()
            return
        upstream = socket.create_connection(target, timeout=TIMEOUT)
        self.send_response(200, "Connection established")
        self.end_headers()
        sockets = [self.connection, upstream]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], TIMEOUT)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is self.connection else self.connection).sendall(data)
        finally:
            upstream.close()

    def log_message(self, *args: object) -> None:
        pass


def _serve(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # shutdown() waits out one poll
    thread.start()
    return thread


class CloudFormationEndpoint:
    """The response endpoint over TLS, and the proxy that leads to it (see the module doc)."""

    def __init__(self, folder: Path) -> None:
        self.ca, cert, key = make_ca_and_server(folder)
        self.tls = ThreadingHTTPServer(("127.0.0.1", 0), _Responses)
        self.tls.received = []  # type: ignore[attr-defined]
        self.tls.attempts = 0  # type: ignore[attr-defined]
        self.tls.unavailable = 0  # type: ignore[attr-defined]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.tls.socket = context.wrap_socket(self.tls.socket, server_side=True)
        self.proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Connect)
        self.proxy.tunnels = []  # type: ignore[attr-defined]
        self.proxy.targets = {(CFN_HOST, 443): ("127.0.0.1", self.tls.server_port)}  # type: ignore[attr-defined]
        self._threads = [_serve(self.tls), _serve(self.proxy)]

    @property
    def received(self) -> list[dict[str, Any]]:
        return self.tls.received  # type: ignore[attr-defined]

    def unavailable(self, times: int) -> None:
        """Answer the next ``times`` PUTs with 503, as S3 sometimes does."""
        self.tls.unavailable = times  # type: ignore[attr-defined]
        self.tls.attempts = 0  # type: ignore[attr-defined]

    @property
    def attempts(self) -> int:
        return self.tls.attempts  # type: ignore[attr-defined]

    @property
    def tunnels(self) -> list[str]:
        """Every host the writer tried to reach through the proxy."""
        return self.proxy.tunnels  # type: ignore[attr-defined]

    def url(self, request_id: str) -> str:
        return f"https://{CFN_HOST}/arn%3Aaws%3Acloudformation%3Aus-east-1%3A123456789012%3Astack/S/1%7C{request_id}?X-Amz-Signature=x"

    def environ(self) -> dict[str, str]:
        return {
            "HTTPS_PROXY": f"http://127.0.0.1:{self.proxy.server_port}",
            "https_proxy": f"http://127.0.0.1:{self.proxy.server_port}",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "SSL_CERT_FILE": str(self.ca),
        }

    def close(self) -> None:
        for server in (self.proxy, self.tls):
            server.shutdown()
            server.server_close()


# ------------------------------------------------------------------ the store, with faults


ERRORS = {
    "ThrottlingException": (400, "ThrottlingException", "Rate exceeded"),
    "InvalidKeyId": (400, "InvalidKeyId", "Invalid keyId alias/does-not-exist"),
    "AccessDeniedException": (400, "AccessDeniedException", "User is not authorized to perform: ssm:PutParameter"),
    "InternalServerError": (500, "InternalServerError", "internal error"),
    "AccessDenied": (403, "AccessDenied", "Access Denied"),
}


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _operation(self) -> str:
        target = self.headers.get("X-Amz-Target")
        if target:  # SSM speaks JSON with the operation in this header
            return target.rsplit(".", 1)[-1]
        return f"s3:{self.command}"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        operation = self._operation()
        server = self.server
        with server.lock:  # type: ignore[attr-defined]
            server.seen[operation] += 1  # type: ignore[attr-defined]
            remaining = server.faults.get(operation)  # type: ignore[attr-defined]
            fault = None
            if remaining and remaining[2] > 0:  # still passed through
                server.faults[operation] = (remaining[0], remaining[1], remaining[2] - 1)  # type: ignore[attr-defined]
            elif remaining and remaining[1] != 0:
                fault = remaining[0]
                server.faults[operation] = (remaining[0], remaining[1] - 1, 0)  # type: ignore[attr-defined]
        if fault:
            status, code, message = ERRORS[fault]
            s3 = operation.startswith("s3:")  # S3 answers in XML, SSM in JSON
            payload = (f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode() if s3
                       else json.dumps({"__type": code, "message": message}).encode())
            self.send_response(status)
            self.send_header("Content-Type", "application/xml" if s3 else "application/x-amz-json-1.1")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", server.upstream_port, timeout=TIMEOUT)  # type: ignore[attr-defined]
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


class FaultProxy:
    """Forwards to moto on ``upstream_port``; ``fail(operation, error, times, after)`` injects faults
    (``times=-1``: always) once ``after`` requests of the operation went through; ``seen`` counts
    the requests per operation (``PutParameter``, ``DeleteParameter``, ``s3:GET``...)."""

    def __init__(self, upstream_port: int) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
        self.server.upstream_port = upstream_port  # type: ignore[attr-defined]
        self.server.lock = threading.Lock()  # type: ignore[attr-defined]
        self.server.seen = Counter()  # type: ignore[attr-defined]
        self.server.faults = {}  # type: ignore[attr-defined]
        self._thread = _serve(self.server)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def seen(self) -> Counter:
        return self.server.seen  # type: ignore[attr-defined]

    def fail(self, operation: str, error: str, times: int = -1, after: int = 0) -> None:
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.faults[operation] = (error, times, after)  # type: ignore[attr-defined]

    def reset(self) -> None:
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.faults.clear()  # type: ignore[attr-defined]
            self.server.seen.clear()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------ one Create, as CloudFormation sends it


WRITER_STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/RayitoFleet/0d5c5a40-0000-11f0-9000-0a1b2c3d4e5f"
WRITER_FUNCTION = "RayitoFleet-RayitoRecipeWriterFunction"
WRITER_RESOURCE = "FleetRecipeResource0A1B2C3D"


def write_recipe(document: dict[str, Any], *, image_version: Optional[str], moto: str, bucket: str,
                 cfn: CloudFormationEndpoint, monkeypatch: Any) -> dict[str, Any]:
    """Store ``document`` (``RecipePlan.document``, as the stack ships it) with the writer's own
    entry point (``index.handler``): the document uploaded to moto's S3 as ``cdk deploy`` uploads
    the asset, a Create event for the fleet's recipe resource with the ``image_version``
    CloudFormation resolved, the environment the stack gives the function, real boto3 clients on
    moto. Returns CloudFormation's answer (its body)."""
    import hashlib
    import json as json_

    from lambdas.recipe_writer import index
    from rayito_constructs.model.product import canonical_json

    from .lambda_runner import LambdaContext
    from .moto_server import client

    ssm, s3 = client("ssm", moto), client("s3", moto)
    data = canonical_json(document).encode()
    digest = hashlib.sha256(data).hexdigest()
    s3.put_object(Bucket=bucket, Key=f"{digest}.json", Body=data)  # type: ignore[attr-defined]
    context = LambdaContext(WRITER_FUNCTION, timeout_seconds=150, memory_mb=256)
    fleet = str(document["name"])
    properties = {"ServiceToken": context.invoked_function_arn, "ParameterName": f"/rayito/agents/{fleet}/recipe",
                  "DocumentBucket": bucket, "DocumentKey": f"{digest}.json", "DocumentSha256": digest,
                  "KeepOnDelete": "false", "FailureMode": "fail"}
    if image_version is not None:
        properties["ImageVersion"] = image_version
    event = {"RequestType": "Create", "ServiceToken": context.invoked_function_arn, "StackId": WRITER_STACK_ID,
             "ResponseURL": cfn.url(f"create-{fleet}"), "RequestId": f"create-{fleet}",
             "LogicalResourceId": WRITER_RESOURCE, "ResourceType": index.RESOURCE_TYPE,
             "ResourceProperties": properties}
    with monkeypatch.context() as patch:
        for key, value in {**cfn.environ(), "AWS_REGION": "us-east-1", "STACK_ID": WRITER_STACK_ID,
                           "RECIPE_RESOURCES": json_.dumps({WRITER_RESOURCE: fleet})}.items():
            patch.setenv(key, value)
        index.handler(event, context, clients_factory=lambda: index.Clients(ssm=ssm, s3=s3))
    (answer,) = [r["body"] for r in cfn.received if r["body"]["RequestId"] == f"create-{fleet}"][-1:]
    return answer
