"""Errors of the config package.

ConfigError (root)
├── ConfigFileError   the file cannot be read or is not YAML (lint exits 2)
├── ConfigInvalid     the file was read but has problems; ``.issues`` lists every one (lint exits 1)
├── images.ImageReferenceError   not an image reference a deploy can pin (also a ValueError)
└── machine_images.SelectorError   not a Hetzner label selector (also a ValueError)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in sp00ky.yml: where (dotted path and YAML line), which rule, what to do."""

    path: str
    code: str
    message: str
    line: int
    severity: Severity = "error"

    def render(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{self.path}: {prefix}{self.message} [{self.code}] (line {self.line})"

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "code": self.code,
            "message": self.message,
            "line": self.line,
            "severity": self.severity,
        }


class ConfigError(Exception):
    """Root of every config error."""


class ConfigFileError(ConfigError):
    """sp00ky.yml cannot be read or is not valid YAML."""


class ConfigInvalid(ConfigError):
    """sp00ky.yml was read but breaks the schema or a lint rule."""

    def __init__(self, issues: Sequence[Issue], source: str = "sp00ky.yml") -> None:
        self.issues = tuple(issues)
        errors = [issue for issue in self.issues if issue.severity == "error"]
        lines = "\n".join(issue.render() for issue in errors)
        super().__init__(f"{source} has {len(errors)} problem(s):\n{lines}")
