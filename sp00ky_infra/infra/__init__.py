"""Infrastructure: the Pulumi components (firewalled Hetzner machines, a local Docker stack)
and the Hetzner machine dynamic provider.

Only the project's ``__main__.py`` reads Pulumi config; everything here takes typed args. The
user-data, the join tokens and the labels come from ``sp00ky_infra.shared``; the API client
from ``sp00ky_infra.hetzner``.
"""
