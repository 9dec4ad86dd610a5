"""The on-machine agent: dials out to the controller, runs the backend, sends it jobs.

Standard library and ``requests`` only; it never imports ``sp00ky_infra``. Run it as
``python -m agent``; its settings come from the environment and, on a VM, from the file
cloud-init writes (``SPKY_AGENT_SETTINGS_FILE``), never from the cloud's metadata.
"""
