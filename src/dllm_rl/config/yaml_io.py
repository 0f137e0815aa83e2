"""The one YAML reader for what a user writes (config files, ``key=value`` overrides, eval settings), bounded
against alias bombs, runaway nesting and self-referential values."""

from __future__ import annotations

from typing import Any

import yaml

from dllm_rl.config.fields import ConfigError

#: what one YAML document may hold once its aliases are expanded (nodes), and how deep it may nest. A config is
#: a few hundred nodes a few levels deep; the bounds stop an alias bomb (nested anchors that expand to
#: gigabytes) and a document too deep for the composer's recursion before anything walks the expanded value.
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 100


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, before constructing any value, a document nested deeper than
    :data:`YAML_MAX_DEPTH`, one whose aliases expand past :data:`YAML_MAX_NODES` nodes, and an alias to a node
    that contains it (a self-referential value, which every walk of the config would recurse into forever)."""

    def compose_node(self, parent, index):
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise ConfigError(f"line {line}: nested deeper than {YAML_MAX_DEPTH} levels; a config is a few "
                                  "levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes of ``root`` with every alias expanded (a shared node counts once per use), without
    expanding anything: an iterative depth-first walk that sizes each distinct node once. Raises
    :class:`ConfigError` on a cycle or past :data:`YAML_MAX_NODES`."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: an alias to one of them is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > YAML_MAX_NODES:
                raise ConfigError(f"line {node.start_mark.line + 1}: its aliases (*name) expand to more than "
                                  f"{YAML_MAX_NODES:,} values; write the values out instead of nesting anchors")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise ConfigError(f"line {node.start_mark.line + 1}: an alias (*name) refers to a value that contains "
                              "it (a self-referential value); write the value out")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def yaml_load(text: str | bytes, where: str) -> Any:
    """Parse YAML ``text`` (a file's bytes must be UTF-8) with the bounds of :class:`_BoundedLoader`; raises
    :class:`ConfigError` prefixed with ``where`` (a file name, or an override) on any problem. The one YAML
    reader for what a user writes: config files, ``key=value`` overrides, eval settings files and options."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = text[: exc.start].count(b"\n") + 1
            raise ConfigError(f"{where}: not UTF-8 text (byte {text[exc.start]:#04x} on line {line}); save the "
                              "file as UTF-8") from None
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({exc})") from None
    finally:
        loader.dispose()
