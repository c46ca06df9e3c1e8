"""The YAML reader every hand-edited file goes through: a mapping with the line of each key, so a mistake is an
``InputError`` naming the file and the line. Refused here for every file alike: anything that is not YAML,
duplicate keys, anchors, aliases and merge keys, values that do not construct."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~20x faster, same errors and marks


def node_line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """Parse YAML into its node tree (the line of every value) and its data. Refused here: anything that is not
    YAML, duplicate keys (YAML's last-one-wins silently dropped settings), anchors / aliases and merge keys
    (an alias bomb expands a small file into billions of values), and values that do not construct."""
    loader = _Loader(text)
    node = None
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_tree(node, source)
        data = loader.construct_document(node) if node is not None else None
    except (ValueError, OverflowError) as e:  # a scalar that does not construct, e.g. a date that does not exist
        raise InputError(source, f"not valid YAML: {e}", _unconstructible(loader, node)) from None
    except yaml.reader.ReaderError as e:
        line = text[: e.position].count("\n") + 1 if isinstance(e.position, int) else None
        ch = chr(e.character) if isinstance(e.character, int) else e.character  # libyaml gives the code point
        raise InputError(source, f"not valid YAML: character {ch!r}: {e.reason}", line) from None
    except yaml.MarkedYAMLError as e:
        problem, line = e.problem or str(e), e.problem_mark.line + 1 if e.problem_mark else None
        if e.context and e.context_mark is not None and e.context_mark.line + 1 != line:
            problem += f" ({e.context} that starts at line {e.context_mark.line + 1})"
        elif e.context:
            problem += f" ({e.context})"
        raise InputError(source, f"not valid YAML: {problem}", line) from None
    except (yaml.YAMLError, RecursionError) as e:
        raise InputError(source, f"not valid YAML: {e}") from None
    finally:
        loader.dispose()
    return node, data


def _unconstructible(loader: Any, root: yaml.Node | None) -> int | None:
    """The line of the first scalar that fails to construct (the constructor's errors carry no mark)."""
    todo = [root] if root is not None else []
    while todo:
        node = todo.pop(0)
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node, deep=True)
            except (ValueError, OverflowError, yaml.YAMLError):
                return node_line(node)
        elif isinstance(node, yaml.MappingNode):
            todo += [n for kv in node.value for n in kv]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value
    return None


_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,47}")


def shown_key(key: object) -> str:
    """A key as an error may show it: a key name is the file's syntax (a typo the user must see), anything else is
    not shown. The file may not be a job file at all: a symlink to /etc/shadow printed its first line."""
    return str(key) if isinstance(key, str) and _KEY_NAME.fullmatch(key) else "a key that is not a key name (not shown)"


def _check_tree(root: yaml.Node, source: str) -> None:
    seen: set[int] = set()
    todo = [root]
    while todo:  # iterative: the depth is the parser's to bound, not Python's stack
        node = todo.pop()
        if id(node) in seen:
            raise InputError(source, "anchors and aliases (&name, *name) are not supported here; write the value out",
                             node_line(node))
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.tag == "tag:yaml.org,2002:merge":
                        raise InputError(source, "merge keys (<<) are not supported here", node_line(k))
                    if k.value in keys:
                        raise InputError(source, f"{shown_key(k.value)}: duplicate key (first at line "
                                                 f"{keys[k.value]}); YAML would silently keep only the last one",
                                         node_line(k))
                    keys[k.value] = node_line(k)
                todo += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value


class Doc:
    """A YAML mapping plus the line of each top-level key, for errors that point at the right line."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        node, data = compose(text, source)
        if data is None:
            data, node = {}, None
        if not isinstance(data, dict):
            raise InputError(source, "expected a mapping of key: value at the top level", 1)
        self.data: dict[str, Any] = data
        self.lines: dict[str, int] = {}
        self.nodes: dict[str, yaml.Node] = {}  # the value node of each top-level key
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                self.lines[str(k.value)] = k.start_mark.line + 1
                self.nodes[str(k.value)] = v

    def fail(self, key: str, message: str) -> InputError:
        return InputError(self.source, f"{key}: {message}", self.lines.get(key))

    def check_keys(self, allowed: set[str]) -> None:
        for k in self.data:
            if k not in allowed:
                raise InputError(self.source, f"{shown_key(k)}: unknown key; expected one of "
                                              f"{', '.join(sorted(allowed))}", self.lines.get(str(k)))

    def get(self, key: str, kind: type, default: Any) -> Any:
        v = self.data.get(key, default)
        if v is None or v is default:
            return v
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if kind is str and isinstance(v, int | float) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise self.fail(key, f"expected {kind.__name__}, got {v!r}")
        return v

    def non_negative(self, key: str, kind: type, default: Any) -> Any:
        v = self.get(key, kind, default)
        if v is not None and v < 0:
            raise self.fail(key, f"must be >= 0, got {v}")
        return v

    def positive(self, key: str, kind: type, default: Any) -> Any:
        v = self.get(key, kind, default)
        if v is not None and v <= 0:
            raise self.fail(key, f"must be > 0, got {v}")
        return v

    def path(self, key: str, base: Path, default: str | None) -> Path | None:
        v = self.get(key, str, default)
        if v is None:
            return None
        p = Path(v).expanduser()
        return p if p.is_absolute() else (base / p)


def read_doc(path: str | Path) -> tuple[Doc, Path]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    return Doc(text, str(p)), p.resolve().parent

