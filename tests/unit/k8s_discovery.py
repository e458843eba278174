"""A stand-in for a Kubernetes API server's discovery endpoints, so that
`kubectl apply --dry-run=client` can map the manifests' kinds without a cluster.

kubectl needs discovery (which kinds exist, namespaced or not) even for a client-side dry
run; every object lookup answers 404, so each manifest is applied as a create. Serves the
kinds deploy/k8s/ uses, KEDA's ScaledObject included (as a cluster with KEDA would)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("namespaces", "Namespace", False),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
    ],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
    "keda.sh/v1alpha1": [("scaledobjects", "ScaledObject", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resource_list(group_version: str) -> dict[str, object]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {"name": n, "singularName": "", "namespaced": ns, "kind": k, "verbs": VERBS}
            for n, k, ns in RESOURCES[group_version]
        ],
    }


def _group_list() -> dict[str, object]:
    groups = []
    for gv in RESOURCES:
        if "/" in gv:
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        body: dict[str, object]
        if path == "/api":
            body = {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        elif path == "/apis":
            body = _group_list()
        elif path == "/api/v1":
            body = _resource_list("v1")
        elif path.startswith("/apis/") and path[6:] in RESOURCES:
            body = _resource_list(path[6:])
        elif path == "/version":
            body = {"major": "1", "minor": "20", "gitVersion": "v1.20.2"}
        else:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404}  # fmt: skip
            self._reply(404, body)
            return
        self._reply(200, body)

    def _reply(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def discovery_server() -> Iterator[str]:
    """Serve discovery on 127.0.0.1; yield the server URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
