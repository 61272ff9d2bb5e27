"""Who may use the service: the bearer token, the listen address rule, and TLS.

The token is compared in constant time (`hmac.compare_digest`), so response timing says
nothing about how much of a guess was right. A service reachable from other machines must
ask for a token: listening beyond loopback without one is refused unless the operator
says `--insecure-no-auth` (for a service behind an authenticating proxy, say).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import ssl

BEARER = "Bearer "


def bearer_problem(authorization: str | None, token: str) -> str | None:
    """Why this Authorization header does not carry `token`, or None when it does."""
    if not authorization:
        return "missing bearer token: send 'Authorization: Bearer <token>' (specwire: --token-file)"
    if not authorization.startswith(BEARER):
        return "the Authorization header is not a bearer token: send 'Authorization: Bearer <token>'"
    if not hmac.compare_digest(authorization[len(BEARER):].strip().encode(), token.encode()):
        return "wrong bearer token"
    return None


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address ("" and 0.0.0.0 are not)."""
    if not host:
        return False  # every interface
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def exposure_problem(host: str, token: str | None, insecure_no_auth: bool) -> str | None:
    """Why listening on `host` like this is refused, or None when it is allowed."""
    if token is None and not insecure_no_auth and not is_loopback(host):
        return (f"refusing to listen on {host or 'every interface'} without a token: anyone who can reach it "
                "could use the service. Give --token-file FILE, or --insecure-no-auth if another layer "
                "authenticates clients")
    return None


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS for wss://: the certificate chain and its private key (PEM files)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
