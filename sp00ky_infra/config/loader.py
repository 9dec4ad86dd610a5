"""Reading sp00ky.yml: YAML -> JSON Schema -> lint rules -> typed, frozen Config.

load_config("sp00ky.yml")      # Config, or raises ConfigInvalid listing every problem
lint_file("sp00ky.yml")        # every Issue (errors and warnings), sorted by line, with the
                               # files a pool backend names checked too (config/files.py)
"""

from __future__ import annotations

import os
from pathlib import Path

from sp00ky_infra.config.document import (
    DUPLICATE_KEY_CODE,
    Document,
    parse_document,
    read_document,
    render_path,
)
from sp00ky_infra.config.errors import ConfigInvalid, Issue
from sp00ky_infra.config.files import FILE_CODE, file_findings
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE, Config, build_config
from sp00ky_infra.config.routes import ROUTE_CODE, schedule_route_findings
from sp00ky_infra.config.rules import run_rules
from sp00ky_infra.config.schema import SCHEMA_CODE, schema_findings

__all__ = ["config_path", "lint_document", "lint_file", "load_config", "parse_document"]


def config_path(explicit: str | None = None) -> Path:
    """The config file: ``--config``, else ``SPKY_CONFIG``, else ``./sp00ky.yml``."""
    return Path(explicit or os.environ.get("SPKY_CONFIG") or DEFAULT_CONFIG_FILE)


def lint_document(doc: Document, *, files: bool = False) -> list[Issue]:
    """Every problem in ``doc``: duplicate keys, schema breaks and lint rules, by line; with
    ``files``, also each file a pool backend names that is missing (``doc`` read from a file)."""
    issues = [
        Issue(
            render_path(path),
            DUPLICATE_KEY_CODE,
            "key appears twice; the later one wins silently in YAML, so remove one",
            line,
        )
        for path, line in doc.duplicates
    ]
    ruled: set[str] = set()
    for each, finding in run_rules(doc.data):
        path = render_path(finding.path)
        ruled.add(path)
        issues.append(
            Issue(path, each.code, finding.message, doc.line_of(finding.path), each.severity)
        )
    for found_path, message in schedule_route_findings(doc):  # reads the backends' specs
        issues.append(Issue(render_path(found_path), ROUTE_CODE, message, doc.line_of(found_path)))
    if files and doc.source is not None:
        for found_path, message in file_findings(doc.data, doc.source.parent):
            issues.append(
                Issue(render_path(found_path), FILE_CODE, message, doc.line_of(found_path))
            )
    for found_path, message, about_value in schema_findings(doc.data):
        path = render_path(found_path)
        if not (about_value and path in ruled):  # a rule's message about that value says more
            issues.append(Issue(path, SCHEMA_CODE, message, doc.line_of(found_path)))
    return sorted(issues, key=lambda issue: (issue.line, issue.path, issue.code))


def lint_file(path: str | Path) -> list[Issue]:
    """Lint a file; raises ConfigFileError when it cannot be read or is not YAML."""
    return lint_document(read_document(path), files=True)


def load_config(path: str | Path | None = None) -> Config:
    """The typed config, or ConfigInvalid with every error (warnings do not stop it)."""
    source = config_path(str(path) if path is not None else None)
    doc = read_document(source)
    errors = [issue for issue in lint_document(doc) if issue.severity == "error"]
    if errors:
        raise ConfigInvalid(errors, str(source))
    return build_config(doc.data, root=str(source.parent))
