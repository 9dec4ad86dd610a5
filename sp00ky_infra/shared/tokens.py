"""Join tokens and session tokens. Pure: standard-library crypto, ``now`` an argument.

A join token rides in a machine's user-data (the only secret there): HMAC-SHA256 with
SPKY_POOL_SECRET over the machine's name, an expiry and a one-time nonce. The agent trades it
once for a session token, which only the controller and that agent know; the controller
keeps its hash. The first join also issues a machine credential (kept by the agent in a 0600
file, hashed by the controller): a rebooted machine rejoins with it for a new session.
The backend's env comes over that session, never through metadata.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sp00ky_infra.shared.errors import SharedError

# How long a join token is good for. A boot takes about a minute (the Machine pools docs,
# "Boot time"), and a token is one-time anyway.
JOIN_TTL_SECONDS = 900.0  # issued by the controller as it creates the machine: 15 min is ample
# Issued when `pulumi up` runs the program: the update may wait behind the stack's lock and
# creates its servers one after another, so the token may be minted well before its VM boots.
STACK_JOIN_TTL_SECONDS = 3600.0


class TokenError(SharedError):
    """A join token that is malformed, forged, expired or for another machine."""


@dataclass(frozen=True, slots=True)
class JoinClaim:
    machine: str
    expires: int
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: str, body: bytes) -> bytes:
    return hmac.new(secret.encode(), b"sp00ky-join:" + body, hashlib.sha256).digest()


def issue_join_token(secret: str, machine: str, now: float, ttl: float = JOIN_TTL_SECONDS) -> str:
    if not secret:
        raise TokenError("SPKY_POOL_SECRET is empty; set a long random string")
    body = f"{machine}|{int(now + ttl)}|{secrets.token_urlsafe(12)}".encode()
    return f"{_b64(body)}.{_b64(_signature(secret, body))}"


def verify_join_token(secret: str, token: str, machine: str, now: float) -> JoinClaim:
    """The token's claim, or TokenError saying why it is refused. (Replays are the store's:
    the nonce may be used once.)"""
    try:
        encoded_body, encoded_signature = token.split(".")
        body, signature = _unb64(encoded_body), _unb64(encoded_signature)
        name, expires_text, nonce = body.decode().split("|")
        expires = int(expires_text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError("join token is malformed") from exc
    if not hmac.compare_digest(signature, _signature(secret, body)):
        raise TokenError("join token signature does not match (forged, or another secret)")
    if name != machine:
        raise TokenError(f"join token is for machine {name!r}, not {machine!r}")
    if now > expires:
        raise TokenError("join token has expired")
    return JoinClaim(name, expires, nonce)


def new_session_token() -> str:
    return secrets.token_urlsafe(32)


def session_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_machine_credential() -> str:
    """The secret a machine gets at its first join (in the join reply, never in metadata):
    with it, its agent rejoins after a reboot. The controller keeps only its hash."""
    return secrets.token_urlsafe(32)


def credential_hash(credential: str) -> str:
    return hashlib.sha256(b"sp00ky-credential:" + credential.encode()).hexdigest()
