"""The controller (the docs' scheduler): sizes pools every tick, asks a provisioner for the
machines they lack, binds queued jobs to free slots through the agents' long-polls, holds
leases, drains idle machines, opens a breaker on failed boots, and serves the agents'
endpoint and an admin API."""
