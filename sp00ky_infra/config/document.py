"""Read ``sp00ky.yml`` into plain data plus the YAML line of every path.

Paths are tuples of keys and list indices: ``("pools", "render", "max")``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.config.errors import ConfigFileError

DUPLICATE_KEY_CODE = "SP002"
PathKey = str | int
DocPath = tuple[PathKey, ...]


def render_path(path: DocPath) -> str:
    """``("pools", "render", "locations", 1)`` -> ``pools.render.locations[1]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top)"


@dataclass(frozen=True, slots=True)
class Document:
    """Plain data from YAML, with where each path stands in the file."""

    data: Any
    lines: Mapping[DocPath, int]
    source: Path | None = None
    duplicates: tuple[tuple[DocPath, int], ...] = field(default=())

    def line_of(self, path: DocPath) -> int:
        """The line of ``path``, or of its nearest ancestor present in the file (1 at worst)."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1


def parse_document(text: str, source: Path | None = None) -> Document:
    """Parse YAML text; malformed YAML raises ConfigFileError with line and column."""
    name = str(source) if source else "<text>"
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigFileError(f"{name}: not valid YAML: {problem}{where}") from exc
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{name}: not valid YAML: {exc}") from exc
    if node is None:
        return Document(data={}, lines={(): 1}, source=source)
    lines: dict[DocPath, int] = {}
    duplicates: list[tuple[DocPath, int]] = []
    constructor = yaml.SafeLoader("")
    data = _convert(node, (), lines, duplicates, constructor)
    return Document(data=data, lines=lines, source=source, duplicates=tuple(duplicates))


def read_document(path: str | Path) -> Document:
    """Read and parse a file; an unreadable file raises ConfigFileError naming it."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigFileError(f"{source}: no such file; pass the path of your sp00ky.yml") from exc
    except IsADirectoryError as exc:
        raise ConfigFileError(
            f"{source}: is a directory; pass the path of your sp00ky.yml"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{source}: cannot be read: {exc}") from exc
    return parse_document(text, source)


def _convert(
    node: yaml.Node,
    path: DocPath,
    lines: dict[DocPath, int],
    duplicates: list[tuple[DocPath, int]],
    constructor: yaml.SafeLoader,
) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        explicit: set[Any] = set()
        for key_node, _ in node.value:  # duplicates among the keys written here, not merged ones
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = constructor.construct_object(key_node, deep=True)
            if key in explicit:
                duplicates.append(((*path, str(key)), key_node.start_mark.line + 1))
            explicit.add(key)
        constructor.flatten_mapping(node)  # merge keys (<<) first, explicit keys override them
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            key_path = (*path, str(key))
            lines[key_path] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, key_path, lines, duplicates, constructor)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _convert(item, (*path, index), lines, duplicates, constructor)
            for index, item in enumerate(node.value)
        ]
    return constructor.construct_object(node, deep=True)
