"""The rehearsal: a local fake Hetzner Cloud whose servers really boot their user-data.

- ``cloud.py``: the fake Hetzner Cloud API (the tests' fake cloud, and the rehearsal's);
  ``catalog.py``: what it knows unasked (locations, server types, error codes, and where
  each answer comes from).
- ``boot.py``: boot mode, a container per server running its user-data through cloud-init
  under systemd, with a Docker engine of its own; the boot's timeline and console log.
- ``image.py``: the machine image those containers run (debootstrap, ``docker import``).
- ``phases.py``: pure, each machine's boot in phases, the cause of a failed boot and the
  Hetzner estimate, the image paths side by side; ``rehearsal.py``: ``sp00ky-infra
  rehearse`` itself; ``paths.py``: an image path's config, and the baked path's bake.
- ``errors.py``: the one exception root, RehearseError.

Above the services (``controller``, ``infra``, ``guardian``), below ``cli``: a rehearsal runs
a user's production config against this local cloud.
"""
