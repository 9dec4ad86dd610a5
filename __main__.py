"""The Pulumi program: pool configs -> firewalled servers whose cloud-init installs the agent.

Not built yet (issue #6: "Pulumi program"). It fails loudly rather than deploy nothing.
"""

raise SystemExit(
    "sp00ky-infra: the Pulumi program is not built yet (issue #6); "
    "`pulumi up` has nothing to deploy"
)
