"""What every side agrees on, with no I/O of its own beyond reading the agent's files: cloud
label keys and resource names, join and session tokens, the guardian's heartbeat format, and
a machine's cloud-init user-data. The controller, the Pulumi program and the guardian all
import from here, never from one another.
"""
