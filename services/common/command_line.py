"""The command line every service shares: ``--help`` and nothing else.

Services are configured only through ``POWERTRIP_*`` variables, so ``--help`` is where a newcomer
learns them: the list is derived from the service's pydantic config class (names, types, defaults
and each field's ``description``), so it cannot drift from what ``load_config`` reads. Answering
``--help`` or a bad argument happens before anything binds a port.
"""

from __future__ import annotations

import argparse
import enum
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from powertrip.services.common.config import env_name
from powertrip.services.common.settings import unset_means

WIDTH = 100
ABOUT_ENV = """\
Configured only through the environment variables below (read once at start; an invalid or
missing one stops the service with exit code 2 and a message naming it; POWERTRIP_* names of other
services are ignored). Once serving it prints 'READY service=... grpc=HOST:PORT metrics=PORT' and
runs until SIGTERM or SIGINT. A port of 0 picks a free one."""


def parse_service_args(
    prog: str, config_cls: type[BaseModel], doc: str | None, argv: Sequence[str] | None = None
) -> None:
    """Print help and exit 0 on ``-h/--help``; exit 2 naming any other argument; return when
    there are none (the service then runs as configured by its environment)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # the usual start: nothing to build
        return
    parser = argparse.ArgumentParser(
        prog=prog,
        description=summary(doc),
        epilog=ABOUT_ENV + "\n\n" + env_help(config_cls),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)


def summary(doc: str | None) -> str:
    """The first line of a ``__main__`` docstring without its ``python -m
    powertrip.services.x:`` label."""
    lines = (doc or "").strip().splitlines()
    text = lines[0].split(": ", 1)[-1] if lines else ""
    return text[:1].upper() + text[1:]


def env_help(config_cls: type[BaseModel]) -> str:
    """Every variable ``load_config(config_cls)`` reads, grouped by the class declaring it."""
    sections = []
    for klass in config_cls.__mro__:
        own = [n for n in vars(klass).get("__annotations__", {}) if n in config_cls.model_fields]
        if not own or not issubclass(klass, BaseModel):
            continue
        lines = [f"{klass.__module__}.{klass.__qualname__}:"]
        for name in own:
            field = config_cls.model_fields[name]
            lines.append(f"  {env_name(name):<38} {describe(field)}")
            if note := field.description:
                lines += textwrap.wrap(
                    note, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6
                )
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def describe(field: FieldInfo) -> str:
    """``int, default 50`` / ``str, required`` / ``str, default gethostname()``."""
    kind = type_name(field.annotation)
    if field.is_required():
        return f"{kind}, required"
    if field.default_factory is not None:
        return f"{kind}, default {getattr(field.default_factory, '__name__', 'computed')}()"
    if field.default is None:
        means = unset_means(field)  # a library field's: the preset's or the library's
        return f"{kind}, default unset" + (f" ({means})" if means else "")
    value = field.default.value if isinstance(field.default, enum.Enum) else field.default
    return f"{kind}, default {str(value).lower() if isinstance(value, bool) else value}"


def type_name(annotation: object) -> str:
    """What a value must look like: ``int``, ``path``, ``emulated|wall``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(type_name(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "|".join(str(m.value) for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return getattr(annotation, "__name__", str(annotation))
