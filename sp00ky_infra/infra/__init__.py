"""Infrastructure: the Pulumi components (firewalled Hetzner machines, a local Docker stack),
the Hetzner machine dynamic provider, cloud-init user-data, and the Hetzner API client.

Only the project's ``__main__.py`` reads Pulumi config; everything here takes typed args.
"""
