"""Docker, asked through the Docker Engine API on its unix socket (no SDK dependency).

This module owns the Docker client: ``http.client`` over AF_UNIX,
``DockerRuntime`` (``GET /containers/{id}/json``, ``GET /_ping``) and
``info_from_docker_inspect`` (pure: one inspect object → ``ContainerInfo``).

The same client talks to anything that serves the Docker-compatible API: dockerd, and podman's
``podman system service`` (which is how the tests run it against a real server here; pass
``name="podman"`` to label what it finds as podman's).

Fields relied on (Engine API v1.41 names, identical in podman 4.3's compat API): ``Id``,
``Name`` (with a leading "/"), ``State.Status``, ``State.Pid``, ``State.OOMKilled``,
``RestartCount``, ``HostConfig.RestartPolicy.{Name,MaximumRetryCount}``,
``Config.Healthcheck.Test``, ``Config.Image`` (falls back to ``Image``, the id) and
``Config.Labels`` (``io.kubernetes.pod.name``/``.namespace`` under dockershim). The API has no
cgroup path: it is read from the main pid's ``/proc/PID/cgroup`` while the container runs.

Which daemon: the one a ``docker`` client on this host would use (``docker_hosts``):
``DOCKER_HOST`` when it is set, else the current Docker context, else the system socket, then
rootless daemons' sockets. A Compose service name (``web`` for ``proj_web_1``) finds its
container by Compose's ``com.docker.compose.service`` label when no container has that name.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import pwd
import socket
import stat
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tracer.runtimes.base import (
    ContainerInfo,
    LookupFailed,
    Runtime,
    exit_state,
    get_bool,
    get_dict,
    get_int,
    get_str,
    healthcheck_test,
    inspect_sections,
    k8s_names,
    restart_policy_text,
)

if TYPE_CHECKING:
    import http.client

__all__ = ["DEFAULT_SOCKET", "DockerRuntime", "docker_hosts", "info_from_docker_inspect"]

DEFAULT_SOCKET = "/var/run/docker.sock"
COMPOSE_SERVICE = "com.docker.compose.service"


def _context_host(config_dir: str, context: str | None) -> str | None:
    """The Docker endpoint of a context (``docker context use NAME``) as the CLI stores it:
    ``config.json`` names the current one, ``contexts/meta/<sha256 of name>/meta.json`` holds
    ``Endpoints.docker.Host``. None for the default context or anything unreadable."""
    try:
        if context is None:
            with open(os.path.join(config_dir, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            context = cfg.get("currentContext") if isinstance(cfg, dict) else None
        if not isinstance(context, str) or context in ("", "default"):
            return None
        digest = hashlib.sha256(context.encode()).hexdigest()
        with open(
            os.path.join(config_dir, "contexts", "meta", digest, "meta.json"), encoding="utf-8"
        ) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    host = get_str(get_dict(get_dict(meta, "Endpoints"), "docker"), "Host")
    return host or None


def docker_hosts(
    env: Mapping[str, str] | None = None, *, run_user: str = "/run/user", home: str | None = None
) -> list[str]:
    """The Docker daemons this host's ``docker`` client would talk to, best first, as endpoint
    URLs (``unix:///var/run/docker.sock``).

    ``DOCKER_HOST`` set: only that one (the client uses nothing else). Else the current context
    (``DOCKER_CONTEXT``, or ``currentContext`` in ``$DOCKER_CONFIG`` / ``~/.docker``, and under
    sudo the invoking user's), then the system socket, then every rootless daemon's socket
    (``$XDG_RUNTIME_DIR/docker.sock``, ``/run/user/UID/docker.sock``): whyrestart runs as root
    and may be asked about any user's containers.
    """
    env = os.environ if env is None else env
    if env.get("DOCKER_HOST"):
        return [env["DOCKER_HOST"]]
    out: list[str] = []
    context = env.get("DOCKER_CONTEXT") or None
    config_dirs = [
        env.get("DOCKER_CONFIG") or os.path.join(home or os.path.expanduser("~"), ".docker")
    ]
    sudo_user = env.get("SUDO_USER")
    if sudo_user and not env.get("DOCKER_CONFIG"):
        with contextlib.suppress(KeyError):
            config_dirs.append(os.path.join(pwd.getpwnam(sudo_user).pw_dir, ".docker"))
    for d in config_dirs:
        host = _context_host(d, context)
        if host:
            out.append(host)
    out.append(f"unix://{DEFAULT_SOCKET}")
    rootless = []
    if env.get("XDG_RUNTIME_DIR"):
        rootless.append(os.path.join(env["XDG_RUNTIME_DIR"], "docker.sock"))
    if env.get("SUDO_UID"):
        rootless.append(os.path.join(run_user, env["SUDO_UID"], "docker.sock"))
    rootless += sorted(glob.glob(os.path.join(glob.escape(run_user), "*", "docker.sock")))
    out += [f"unix://{p}" for p in rootless]
    return list(dict.fromkeys(out))  # in order, once each


# An inspect document is a few KiB; a huge reply means something else is on that socket.
_MAX_BODY = 8 * 1024 * 1024


@functools.cache
def _connection_class() -> Callable[[str, float], http.client.HTTPConnection]:
    """``http.client.HTTPConnection`` whose transport is a unix-domain stream socket.

    Built on first use: ``http.client`` pulls in ``ssl`` and ``email`` (about 5 MB of resident
    memory), which a recorder that never talks to dockerd should not carry. The host part of
    the URL is meaningless on a unix socket; dockerd ignores it, but HTTP/1.1 requires a Host
    header, so "localhost" is sent.
    """
    import http.client

    class UnixHTTPConnection(http.client.HTTPConnection):
        def __init__(self, socket_path: str, timeout: float) -> None:
            super().__init__("localhost", timeout=timeout)
            self.socket_path = socket_path

        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    return UnixHTTPConnection


def info_from_docker_inspect(
    obj: Mapping[str, Any], runtime: str = "docker"
) -> ContainerInfo | None:
    """A ``GET /containers/{id}/json`` object → ``ContainerInfo`` (cgroup_path None: the API
    has none). None when the object has no ``Id``."""
    sections = inspect_sections(obj)
    if sections is None:
        return None
    cid, state, config, host = sections
    name = get_str(obj, "Name").lstrip("/")
    labels = config.get("Labels")
    pod, namespace = k8s_names(name, labels if isinstance(labels, Mapping) else None)
    pid = get_int(state, "Pid") or 0
    return ContainerInfo(
        runtime=runtime,
        id=cid,
        name=name,
        cgroup_path=None,
        pid=pid if pid > 0 else 0,
        restart_count=get_int(obj, "RestartCount"),
        restart_policy=restart_policy_text(get_dict(host, "RestartPolicy")),
        healthcheck=healthcheck_test(config),
        image=get_str(config, "Image") or get_str(obj, "Image"),
        state=get_str(state, "Status"),
        oom_killed=get_bool(state, "OOMKilled"),
        pod=pod,
        namespace=namespace,
        **exit_state(obj),
    )


class DockerRuntime(Runtime):
    """The Docker Engine API on a unix socket.

    ``api_version`` (e.g. "1.41") pins the URL prefix; without it the daemon's own version is
    used, which is what the fields above need (they have been stable since API 1.25).
    """

    name = "docker"

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout_s: float = 3.0,
        api_version: str | None = None,
        proc_root: str = "/proc",
        name: str = "docker",
    ) -> None:
        self.name = name
        super().__init__()
        self.socket_path = socket_path
        self.host = f"unix://{socket_path}"
        self.timeout_s = timeout_s
        self.prefix = f"/v{api_version}" if api_version else ""
        self.proc_root = proc_root
        self._unsupported: str | None = None

    @classmethod
    def for_host(cls, host: str, **kwargs: Any) -> DockerRuntime:
        """A client for an endpoint URL as ``DOCKER_HOST`` spells it. Only ``unix://`` is
        spoken (whyrestart runs on the daemon's host); any other scheme gives a client that is
        never available, whose ``last_error`` says so."""
        if host.startswith("unix://"):
            return cls(host[len("unix://") :], **kwargs)
        rt = cls(host, **kwargs)
        rt.host = host
        rt._unsupported = (
            f"{host}: only unix:// sockets are supported (whyrestart runs on the Docker host; "
            "point DOCKER_HOST at the daemon's unix socket)"
        )
        return rt

    def available(self) -> bool:
        """Whether the daemon answers ``/_ping``; when not, ``last_error`` says why."""
        where = f"docker at {self.host}"
        if self._unsupported is not None:
            self._fail(f"docker: {self._unsupported}", quiet=True)
            return False
        try:
            if not stat.S_ISSOCK(os.stat(self.socket_path).st_mode):
                self._fail(f"{where}: not a socket", quiet=True)
                return False
            status, body = self._get("/_ping")
        except FileNotFoundError:
            self._fail(f"{where}: no socket there", quiet=True)
            return False
        except (OSError, LookupFailed) as exc:
            cause = exc.__cause__ if isinstance(exc, LookupFailed) else exc
            text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
            hint = " (is dockerd running?)" if "refused" in text.lower() else ""
            self._fail(f"{where}: {text}{hint}", quiet=True)
            return False
        if status == 200 and body.strip() == b"OK":
            self._ok()
            return True
        self._fail(f"{where}: /_ping answered {status}: {_api_message(body)}", quiet=True)
        return False

    def find(self, name_or_id: str) -> ContainerInfo | None:
        # Docker shows names as "/web"; accept what users copy from `docker inspect`.
        key = name_or_id.strip().lstrip("/")
        if not key:
            self._fail(f"{self.name}: empty container name")
            return None
        return self._inspect(f"/containers/{urllib.parse.quote(key, safe='')}/json", key)

    def _inspect(self, path: str, service: str | None = None) -> ContainerInfo | None:
        """GET an inspect ``path``: the container, or None with the failure said. A 404 with
        ``service`` given looks for the one container of that Compose service instead."""
        try:
            status, body = self._get(path)
        except LookupFailed as exc:
            self._fail(f"{self.name}: {exc}")
            return None
        if status == 404 and service is not None:
            return self._compose_service(service)
        if status != 200:
            self._fail(f"{self.name}: GET {path} answered {status}: {_api_message(body)}")
            return None
        return self._inspected(path, body)

    def _compose_service(self, service: str) -> ContainerInfo | None:
        """No container has this name: the one container of a Compose service of that name
        (``web`` for ``proj_web_1``), found by the label Compose puts on it."""
        missing = f"{self.name}: no container or Compose service {service!r} at {self.host}"
        filters = json.dumps({"label": [f"{COMPOSE_SERVICE}={service}"]})
        path = f"/containers/json?all=1&filters={urllib.parse.quote(filters)}"
        try:
            status, body = self._get(path)
            listed = json.loads(body) if status == 200 else None
        except (LookupFailed, ValueError):
            listed = None
        if not isinstance(listed, list) or not listed:
            self._fail(missing, quiet=True)
            return None
        if len(listed) > 1:
            names = sorted(
                str((c.get("Names") or ["?"])[0]).lstrip("/") for c in listed if isinstance(c, dict)
            )
            self._fail(
                f"{self.name}: Compose service {service!r} has {len(listed)} containers "
                f"({', '.join(names)}): name one of them",
                quiet=True,
            )
            return None
        cid = listed[0].get("Id") if isinstance(listed[0], dict) else None
        if not isinstance(cid, str) or not cid:
            self._fail(missing, quiet=True)
            return None
        return self._inspect(f"/containers/{cid}/json")

    def _inspected(self, path: str, body: bytes) -> ContainerInfo | None:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            self._fail(f"{self.name}: GET {path} answered non-JSON: {exc}")
            return None
        info = info_from_docker_inspect(obj, self.name) if isinstance(obj, Mapping) else None
        if info is None:
            self._fail(f"{self.name}: GET {path} answered no container object")
            return None
        return self._found(info, self.proc_root)

    def _get(self, path: str) -> tuple[int, bytes]:
        """One GET on a fresh connection; (status, body). Raises ``LookupFailed``.

        A fresh connection per request: lookups are rare (start-up, once per poll interval),
        and a kept-alive connection would need reconnect logic after every daemon restart.
        """
        import http.client

        conn = _connection_class()(self.socket_path, self.timeout_s)
        try:
            conn.request("GET", self.prefix + path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read(_MAX_BODY + 1)
            if len(body) > _MAX_BODY:
                raise LookupFailed(f"GET {path}: reply larger than {_MAX_BODY} bytes")
            return resp.status, body
        except TimeoutError as exc:
            raise LookupFailed(
                f"GET {path} on {self.socket_path} timed out after {self.timeout_s:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise LookupFailed(f"GET {path} on {self.socket_path}: {_exc_text(exc)}") from exc
        finally:
            conn.close()


def _api_message(body: bytes) -> str:
    """The daemon's ``{"message": ...}`` error text, or the start of the body."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(obj, Mapping) and isinstance(obj.get("message"), str):
        return str(obj["message"])
    return body[:200].decode("utf-8", "replace")


def _exc_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
