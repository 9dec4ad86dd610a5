"""The on-machine agent: dials out to the controller, runs the backend, sends it jobs.

Standard library and ``requests`` only; never imports ``sp00ky_infra``. Built by the controller
and agent issues (#4, #5).
"""
