"""sp00ky-infra: machine pools for sp00ky backends.

Layers, bottom to top (checked by tests/repo/test_layers.py):

* ``policy`` and ``config.model`` / ``config.rules`` / ``config.durations``: pure, no I/O.
* ``config``: reads ``sp00ky.yml`` and the shipped JSON Schema.
* ``store``, ``controller``, ``infra``, ``guardian``, ``cli``: the edges that do I/O.
"""

__version__ = "0.1.0"
