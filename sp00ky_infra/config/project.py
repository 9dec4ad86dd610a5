"""Where a project keeps its state: ``.sp00ky/`` next to its sp00ky.yml, whatever the
working directory, so that every command of one project reads and writes one store.

    state_dir("examples/sp00ky.yml")       # examples/.sp00ky
    default_store_url()                    # sqlite:///.sp00ky/state.db beside ./sp00ky.yml

The config file is ``--config`` (or a command's FILE), else ``$SPKY_CONFIG``, else
``./sp00ky.yml`` (``loader.config_path``); ``$SPKY_STORE`` or ``--store`` names a store
elsewhere and wins over the default.
"""

from __future__ import annotations

from pathlib import Path

from sp00ky_infra.config.loader import config_path

STATE_DIR_NAME = ".sp00ky"
STORE_FILE = "state.db"


def state_dir(config_file: str | Path | None = None) -> Path:
    """The project's state directory: ``.sp00ky`` in the directory of its sp00ky.yml."""
    return config_path(str(config_file) if config_file else None).parent / STATE_DIR_NAME


def default_store_url(config_file: str | Path | None = None) -> str:
    """The embedded store of the project whose sp00ky.yml is ``config_file``."""
    return f"sqlite:///{state_dir(config_file) / STORE_FILE}"
