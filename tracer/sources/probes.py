"""Health probes run by whyrestart itself, stamped on the trace's clock.

This module owns ``--probe``, ``--probe-interval`` and ``--probe-timeout``:

* ``parse_probe(spec)``: ``http://HOST:PORT/PATH``, ``tcp://HOST:PORT`` or ``exec:CMD ARGS``
  → ``ProbeSpec``. Bad input is a ``UsageError`` naming the input and the accepted forms
  (durations are ``tracer.parse.values.parse_duration``'s);
* ``run_probe(spec, timeout_s)``: one probe, → ``ProbeResult``;
* ``Prober``: a background thread probing every interval, results drained with ``poll()``.

Semantics follow the kubelet's probes, so that what whyrestart measures is what a liveness
probe would have seen: HTTP is ok for a 2xx/3xx status within the timeout, TCP for a connect
within the timeout, exec for exit status 0 within the timeout (and the command is killed when
it runs over, with its whole process group). An HTTP probe with a body (``ProbeSpec.body``,
repro's ``--probe-data``) POSTs it: a probe that asks for real work, not a cheap /health.

Clock: ``start_ns`` is CLOCK_BOOTTIME (``time.clock_gettime_ns(time.CLOCK_BOOTTIME)``), the
clock ``bpf_ktime_get_boot_ns`` stamps kernel events with, so probe latencies line up with
reclaim stalls and kills in one timeline. A timed-out probe's ``latency_ns`` is the timeout
itself: we know only that the answer took at least that long.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass

from tracer.clock import boottime_ns
from tracer.errors import UsageError
from tracer.events import ProbeSample, signal_name

__all__ = [
    "ProbeResult",
    "ProbeSpec",
    "Prober",
    "parse_probe",
    "run_probe",
]

PROBE_FORMS = "http://HOST:PORT/PATH, tcp://HOST:PORT or exec:CMD [ARGS...]"

# The kubelet reads at most 10 KiB of a probe's body; reading some of it (not just the
# headers) counts a server that stalls mid-body as slow, as the kubelet would.
_HTTP_BODY_LIMIT = 10 * 1024


# ---------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """A parsed ``--probe``. ``text`` is what the user wrote (shown in output and the trace)."""

    kind: str  # "http", "tcp", "exec"
    text: str
    host: str = ""  # http/tcp; an IPv6 address without brackets
    port: int = 0
    path: str = "/"  # http: path and query string, as sent
    argv: tuple[str, ...] = ()  # exec
    # http: a request body makes the probe a POST of it (repro's --probe-data), so that a
    # probe can ask for real work (a one-token completion) rather than a cheap /health
    body: bytes | None = None

    def __str__(self) -> str:
        return self.text


def _bad_probe(spec: str, why: str) -> UsageError:
    return UsageError(
        f"bad --probe {spec!r}: {why}", fix=f"use one of the accepted forms: {PROBE_FORMS}"
    )


def parse_probe(spec: str) -> ProbeSpec:
    """``http://HOST:PORT/PATH`` | ``tcp://HOST:PORT`` | ``exec:CMD ARGS`` → ``ProbeSpec``.

    HTTP's port defaults to 80 and its path to "/"; TCP needs a port. The exec command line is
    split like a shell would (``shlex``), but no shell runs it: write ``exec:sh -c '...'`` for
    pipes and redirections.
    """
    text = spec.strip()
    if text.startswith("exec:"):
        try:
            argv = tuple(shlex.split(text[len("exec:") :]))
        except ValueError as exc:  # unbalanced quotes
            raise _bad_probe(spec, f"cannot split the command: {exc}") from None
        if not argv:
            raise _bad_probe(spec, "no command after 'exec:'")
        return ProbeSpec(kind="exec", text=text, argv=argv)

    scheme, sep, _rest = text.partition("://")
    if not sep:
        raise _bad_probe(spec, "no scheme")
    scheme = scheme.lower()
    if scheme not in ("http", "tcp"):
        raise _bad_probe(spec, f"unsupported scheme {scheme!r}")
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for an unclosed [
        raise _bad_probe(spec, str(exc)) from None
    try:
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise _bad_probe(spec, "the port is not a number from 1 to 65535") from None
    host = parts.hostname or ""
    if not host:
        raise _bad_probe(spec, "no host")
    if parts.username is not None or parts.password is not None:
        raise _bad_probe(spec, "credentials in the URL are not supported")
    if port == 0:
        raise _bad_probe(spec, "port 0")
    if scheme == "tcp":
        if port is None:
            raise _bad_probe(spec, "a TCP probe needs a port")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise _bad_probe(spec, "a TCP probe has no path")
        return ProbeSpec(kind="tcp", text=text, host=host, port=port)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return ProbeSpec(kind="http", text=text, host=host, port=port or 80, path=path)


# ---------------------------------------------------------------------------------------------
# Running one probe


@dataclass(frozen=True, slots=True)
class ProbeResult:
    start_ns: int  # CLOCK_BOOTTIME when the probe began
    latency_ns: int  # how long it took; the timeout itself when it timed out
    ok: bool
    timed_out: bool
    status: int | None  # HTTP status, exec exit status (negative: killed by that signal); TCP None
    error: str  # why it was not ok ("" when ok)

    def sample(self, target: str, unit: str = "") -> ProbeSample:
        """This result as the trace records it: the probe of ``target`` (a followed ``unit``'s,
        or ""), at the time it began."""
        return ProbeSample(
            ts=self.start_ns,
            target=target,
            unit=unit,
            latency_ns=self.latency_ns,
            ok=self.ok,
            timed_out=self.timed_out,
            status=self.status,
            error=self.error,
        )


def run_probe(spec: ProbeSpec, timeout_s: float) -> ProbeResult:
    """Run one probe with an overall deadline of ``timeout_s``. Never raises for a probe that
    fails: failures are results."""
    start = boottime_ns()
    timeout_ns = int(timeout_s * 1e9)
    if spec.kind == "http":
        ok, timed_out, status, error = _http(spec, timeout_s, start)
    elif spec.kind == "tcp":
        ok, timed_out, status, error = _tcp(spec, timeout_s)
    else:
        ok, timed_out, status, error = _exec(spec, timeout_s)
    latency = boottime_ns() - start
    if not timed_out and latency > timeout_ns:
        # An answer that came in just past the deadline (a response read by the last few
        # recv() calls, an exec that exited as its wait ran out) is still too late: the
        # deadline is the whole probe's, as the kubelet counts it.
        ok, timed_out, error = False, True, error or f"answered after {latency / 1e9:.3f} s"
    if timed_out:
        latency = timeout_ns
        if not error:
            error = f"timed out after {timeout_s:g} s"
    return ProbeResult(start, latency, ok, timed_out, status, "" if ok else error)


_Outcome = tuple[bool, bool, int | None, str]  # ok, timed_out, status, error


def _http(spec: ProbeSpec, timeout_s: float, start_ns: int) -> _Outcome:
    deadline = start_ns + int(timeout_s * 1e9)
    import http.client  # (with ssl and email, ~5 MB: only for a recording with http probes)

    conn = http.client.HTTPConnection(spec.host, spec.port, timeout=timeout_s)

    def shrink_timeout() -> None:
        # http.client gives every socket operation the full timeout; the probe has one
        # deadline, so each step gets only what is left of it.
        left = (deadline - boottime_ns()) / 1e9
        if left <= 0:
            raise TimeoutError
        if conn.sock is not None:
            conn.sock.settimeout(left)

    try:
        conn.connect()
        shrink_timeout()
        headers = {"User-Agent": "whyrestart-probe", "Accept": "*/*", "Connection": "close"}
        if spec.body is not None:
            headers["Content-Type"] = _content_type(spec.body)
        conn.request("GET" if spec.body is None else "POST", spec.path, spec.body, headers)
        shrink_timeout()
        resp = conn.getresponse()
        shrink_timeout()  # the response reads through the same socket
        resp.read(_HTTP_BODY_LIMIT)
        status = resp.status
    except TimeoutError:
        return False, True, None, f"no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as exc:
        return False, False, None, _exc_text(exc)
    finally:
        conn.close()
    if 200 <= status < 400:
        return True, False, status, ""
    return False, False, status, f"HTTP {status}"


def _content_type(body: bytes) -> str:
    """JSON when the body is JSON (what a model server's API takes), else a form, as curl's
    ``-d`` sends it."""
    import json

    try:
        json.loads(body)
    except ValueError:
        return "application/x-www-form-urlencoded"
    return "application/json"


def _tcp(spec: ProbeSpec, timeout_s: float) -> _Outcome:
    try:
        sock = socket.create_connection((spec.host, spec.port), timeout=timeout_s)
    except TimeoutError:
        return False, True, None, f"no connection within {timeout_s:g} s"
    except OSError as exc:
        return False, False, None, _exc_text(exc)
    sock.close()
    return True, False, None, ""


def _exec(spec: ProbeSpec, timeout_s: float) -> _Outcome:
    try:
        # A new session: on timeout the whole process group is killed, so `sh -c 'sleep 60'`
        # does not leave its sleep behind. Output is discarded: a chatty probe must not fill
        # a pipe and block, and nothing here reads application output.
        proc = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return False, False, None, f"cannot run {spec.argv[0]!r}: {exc.strerror or exc}"
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return False, True, None, f"still running after {timeout_s:g} s (killed)"
    if code == 0:
        return True, False, 0, ""
    if code < 0:
        return False, False, code, f"killed by {signal_name(-code)}"
    return False, False, code, f"exit status {code}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group leader changed credentials; at least the child
        proc.kill()
    proc.wait()


def _exc_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Periodic probing


class Prober:
    """Run a probe every ``interval_s`` in a background thread, never two at once.

    A probe that takes longer than the interval delays the next one (which then starts as soon
    as it ends); probes never overlap, so one stuck endpoint cannot pile up connections. The
    first probe starts when ``start()`` is called. Results wait in a queue of ``max_queue``;
    when the caller does not drain it, the oldest are dropped and counted in ``dropped``.
    """

    def __init__(
        self, spec: ProbeSpec, interval_s: float, timeout_s: float, *, max_queue: int = 4096
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise UsageError("probe interval and timeout must be more than zero")
        self.spec = spec
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.dropped = 0
        self.completed = 0  # probes run so far (kept + dropped)
        self._lock = threading.Lock()
        self._results: collections.deque[ProbeResult] = collections.deque(maxlen=max_queue)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="probe", daemon=True)
            self._thread.start()

    def poll(self) -> list[ProbeResult]:
        """Results since the last call, oldest first (never blocks on a probe)."""
        with self._lock:
            out = list(self._results)
            self._results.clear()
        return out

    def stop(self) -> None:
        """Stop after the probe in flight (bounded by its timeout) and join the thread."""
        self._stop.set()
        if self._thread is not None:
            # A probe in flight ends within its timeout (exec: plus the kill and reap).
            self._thread.join(self.timeout_s + 5.0)

    def __enter__(self) -> Prober:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        # Schedule on the monotonic clock (what Event.wait uses); stamps are CLOCK_BOOTTIME.
        next_start = time.monotonic()
        while not self._stop.is_set():
            result = run_probe(self.spec, self.timeout_s)
            with self._lock:
                if len(self._results) == self._results.maxlen:
                    self.dropped += 1  # deque(maxlen) drops the oldest itself; count it
                self._results.append(result)
                self.completed += 1
            # Keep the cadence when probes are quick; when one overran, start right away.
            next_start = max(next_start + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, next_start - time.monotonic()))
