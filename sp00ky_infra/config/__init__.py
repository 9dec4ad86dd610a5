"""sp00ky.yml: its JSON Schema, lint rules and the typed, frozen values the program reads.

Pure parts (importing this package pulls in no I/O): ``model``, ``rules``, ``durations``,
``errors``. Reading files and validating against the schema: ``loader`` (``load_config``,
``lint_file``), ``document``, ``schema``.
"""

from sp00ky_infra.config.errors import ConfigError, ConfigFileError, ConfigInvalid, Issue
from sp00ky_infra.config.model import Backend, Config, Pool

__all__ = ["Backend", "Config", "ConfigError", "ConfigFileError", "ConfigInvalid", "Issue", "Pool"]
