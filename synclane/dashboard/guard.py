"""Who may see the page and who may act on it: the checks every request passes, the headers
every answer carries, and the login (a secret exchanged for a signed cookie).

- The Host header must name this server or a public name it was given (DNS rebinding).
- A request that came through a proxy is refused unless the proxy is trusted.
- A browser's request from another site (Origin, Sec-Fetch-Site) is refused, reads included.
- A change (POST) also needs the page's token in a header and a JSON body.
- With a login secret, everything but the login page (and /metrics, when served: a scraper
  cannot log in) needs the session cookie it gives.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from synclane.model import ConfigError

TOKEN_HEADER = "X-Synclane-Token"
SESSION_COOKIE = "synclane_session"
SESSION_SECONDS = 12 * 3600
MIN_SECRET_LENGTH = 16
LOGIN_SECRET_ENV = "SYNCLANE_DASHBOARD_SECRET"
# A proxy on loopback makes every client look local: requests that name one are refused unless
# the proxy is trusted (and then the proxy, or the login, must authenticate).
FORWARDING_HEADERS = ("X-Forwarded-For", "Forwarded", "X-Real-IP", "X-Forwarded-Host")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)


class Refused(Exception):
    """A request the dashboard will not serve: the status and a message for the client."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine: localhost, 127.0.0.0/8 or ::1."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if not name:
        return False
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _split_host(value: str) -> tuple[str, str] | None:
    """A Host header as (name, port), both lower case; None when it is malformed."""
    value = value.strip().lower()
    if not value:
        return None
    if value.startswith("["):  # an IPv6 literal, e.g. [::1]:8080
        name, bracket, rest = value.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        return name + bracket, rest[1:]
    name, _, port = value.partition(":")
    if ":" in port or not name:
        return None
    return name, port


def check_public_hosts(hosts: Iterable[str]) -> tuple[str, ...]:
    """The extra names the page answers to, checked: `name` or `name:port`."""
    if isinstance(hosts, str):
        hosts = [hosts]
    checked = []
    for host in hosts:
        parts = _split_host(host) if isinstance(host, str) else None
        if parts is None or "/" in host or (parts[1] and not parts[1].isdigit()):
            raise ConfigError(
                f"public host {host!r:.100} must be a host name with an optional port, e.g. "
                "--public-host dash.example.com or --public-host 192.0.2.10:8080"
            )
        checked.append(":".join(part for part in parts if part))
    return tuple(checked)


class HostCheck:
    """Which Host headers name this server: the loopback names and the bound address with this
    server's port, and the public names given (with their port, when one is given)."""

    def __init__(self, bound: str | None, public_hosts: Iterable[str]) -> None:
        names = set(LOOPBACK_NAMES)
        if bound:
            name = bound.strip("[]").lower()
            if name not in ("", "0.0.0.0", "::"):
                names.add(f"[{name}]" if ":" in name else name)
        self.local = frozenset(names)
        self.public: dict[str, str | None] = {}
        for host in check_public_hosts(public_hosts):
            parts = _split_host(host)
            assert parts is not None
            self.public[parts[0]] = parts[1] or None

    def allows(self, header: str | None, port: str | None) -> bool:
        """Whether `header` names this server, whose port is `port` (None: not known)."""
        parts = _split_host(header or "")
        if parts is None:
            return False
        name, sent_port = parts
        if name in self.public:
            wanted = self.public[name]
            return wanted is None or sent_port in ("", wanted)
        if name in self.local:
            return not sent_port or port is None or sent_port == port
        return False


def same_origin(origin: str, hosts: Iterable[str | None]) -> bool:
    """Whether a browser's Origin names one of `hosts` (the Host, or a trusted proxy's)."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return any(
        host is not None and parts.netloc.lower() == host.split(",")[0].strip().lower()
        for host in hosts
    )


def refuse_cross_site(headers: Mapping[str, str], hosts: Iterable[str | None]) -> None:
    """A browser says where a request comes from: only this page's own origin may read or act.
    A script (curl) sends neither header; it is judged by the token and the login instead."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        raise Refused(403, f"refused: a {site} request")
    origin = headers.get("Origin")
    if origin is not None and not same_origin(origin, hosts):
        raise Refused(403, "refused: the request comes from another origin")


def check_login_secret(secret: object) -> str | None:
    if secret is None:
        return None
    if not isinstance(secret, str) or len(secret.strip()) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"the dashboard's login secret ({LOGIN_SECRET_ENV}) must be at least "
            f"{MIN_SECRET_LENGTH} characters; make one with: python -c "
            "'import secrets; print(secrets.token_urlsafe(24))'"
        )
    return secret


class Login:
    """A login secret exchanged for a session cookie. The cookie holds its expiry and an HMAC
    of it under a key derived from the secret: any process given the same secret accepts it,
    and changing the secret ends every session. Failed attempts are limited, so the secret
    cannot be guessed at the speed of the network."""

    ATTEMPTS = 5
    PER_SECONDS = 10.0

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self._key = hmac.new(self._secret, b"synclane dashboard session v1", "sha256").digest()
        self._failures: list[float] = []
        self._lock = threading.Lock()

    def token(self) -> str:
        """The page's token for every change: the same in every process that has the secret."""
        return hmac.new(self._key, b"requeue token", "sha256").hexdigest()

    def check(self, offered: object) -> bool:
        with self._lock:
            now = time.monotonic()
            self._failures = [t for t in self._failures if t > now - self.PER_SECONDS]
            if len(self._failures) >= self.ATTEMPTS:
                raise Refused(
                    429,
                    "too many wrong secrets; wait a few seconds",
                    [("Retry-After", str(round(self.PER_SECONDS)))],
                )
            given = offered.encode() if isinstance(offered, str) else b""
            ok = hmac.compare_digest(
                hashlib.sha256(given).digest(), hashlib.sha256(self._secret).digest()
            )
            if not ok:
                self._failures.append(now)
            return ok

    def session(self) -> str:
        expires = int(time.time()) + SESSION_SECONDS
        return f"{expires}.{self._sign(expires)}"

    def valid(self, cookie: str | None) -> bool:
        if not cookie:
            return False
        expires, _, signature = cookie.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(signature, self._sign(int(expires)))

    def _sign(self, expires: int) -> str:
        return hmac.new(self._key, str(expires).encode(), "sha256").hexdigest()


def random_token() -> str:
    """A token for one server's changes: only a page it rendered can requeue or pause."""
    return secrets.token_urlsafe(32)


def session_cookie(value: str, path: str, secure: bool, max_age: int = SESSION_SECONDS) -> str:
    attributes = [
        f"{SESSION_COOKIE}={value}",
        f"Path={path or '/'}",
        f"Max-Age={max_age}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if secure:
        attributes.append("Secure")
    return "; ".join(attributes)
