"""The Hetzner Cloud API: one client whose every call goes through one ``request()`` seam,
the API's error codes, typed server, firewall, server type and pricing records, and the
heartbeat kept on a firewall's labels. The controller (heartbeats), the Pulumi program
(servers, firewalls) and the guardian all use this part; it uses nothing of theirs.
"""

from sp00ky_infra.hetzner.client import HetznerAPI, backoff
from sp00ky_infra.hetzner.domain import Firewall, Pricing, RateLimit, Server
from sp00ky_infra.hetzner.errors import UNAVAILABLE, HcloudError

__all__ = [
    "UNAVAILABLE",
    "Firewall",
    "HcloudError",
    "HetznerAPI",
    "Pricing",
    "RateLimit",
    "Server",
    "backoff",
]
