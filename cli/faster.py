"""What makes a short spotctl command start fast (bench/cli_startup.py): Typer's Rich help without
the modules it never uses, plain options converted without pydantic, and each command's signature
read once. Each keeps what the user sees exactly as Typer shows it (tests/test_startup.py)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path


def faster_start() -> None:
    """Install the lighter Rich help, the plain option conversion and the read-once signatures (once)."""
    if "typer.rich_utils" not in sys.modules and not any(isinstance(f, _LighterRichHelp) for f in sys.meta_path):
        sys.meta_path.insert(0, _LighterRichHelp())
    plain_coercion()
    signatures_once()


def signatures_once() -> None:
    """Typer reads each command function's signature and type hints twice while it builds the app
    (its parameters, then their names for the callback), a tenth of ``spotctl --help``: read once.
    Typer only reads what it gets back."""
    try:
        from typer import main
    except ImportError:
        return
    typers = getattr(main, "get_params_from_function", None)
    if typers is None or getattr(typers, "spotctl_once", False):
        return
    seen: dict = {}

    def once(func):
        if func not in seen:
            seen[func] = typers(func)
        return seen[func]

    once.spotctl_once = True
    main.get_params_from_function = once


class _LighterRichHelp:
    """Typer imports ``typer.rich_utils`` to print help and errors, and that module imports
    ``rich.markdown`` (markdown-it) and ``rich.traceback`` (pygments) at its top although spotctl
    uses neither (no Markdown markup mode, pretty exceptions off): a third of ``spotctl --help``'s
    start-up. While rich_utils is imported, those two modules are stand-ins whose one
    name imports the real module on first use; afterwards the real modules import as usual."""

    STAND_INS = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}

    def find_spec(self, name, path=None, target=None):
        if name != "typer.rich_utils":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_with_stand_ins(module):
            installed = {m: self._stand_in(m, cls) for m, cls in self.STAND_INS.items() if m not in sys.modules}
            sys.modules.update(installed)
            try:
                exec_module(module)
            finally:
                for m, stand_in in installed.items():
                    if sys.modules.get(m) is stand_in:
                        del sys.modules[m]

        spec.loader.exec_module = exec_with_stand_ins
        return spec

    @staticmethod
    def _stand_in(module: str, name: str):
        import importlib
        import types

        stand_in = types.ModuleType(module)

        def real():
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]
            return getattr(importlib.import_module(module), name)

        setattr(stand_in, name, type(name, (), {
            "__new__": lambda cls, *args, **kwargs: real()(*args, **kwargs),
            "from_exception": classmethod(lambda cls, *args, **kwargs: real().from_exception(*args, **kwargs)),
        }))
        return stand_in


def plain_coercion() -> None:
    """Typer (0.2x) converts every parameter through a pydantic ``TypeAdapter`` built on its first
    use, even one left at its default: importing pydantic and building the adapters is most of a
    short command's start-up (bench/cli_startup.py). For the plain annotations spotctl's
    options have (str, int, float, Path, an Enum) and a value of the plain shape, the result is
    computed here as the adapter would (paths and choices by Typer's own pydantic-free helpers);
    anything else, a bad value included (so the message is Typer's), goes to Typer's adapter.
    Typer versions without this machinery are left alone."""
    try:
        from dataclasses import dataclass

        from typer import _param_types as types
        from typer import core
        from typer._coercion import RuntimeParam

        typers = core.build_runtime_param
    except (ImportError, AttributeError):
        return
    if getattr(typers, "spotctl_plain", False):
        return
    import re

    digits = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")  # well inside int64: no big-number edge cases
    decimal = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")
    missing = object()

    def plain_value(desc, value, param, ctx):
        info, kind = desc.parameter_info, desc.annotation
        if not isinstance(value, str) or info.parser is not None or desc.file_annotation is not None:
            return missing
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            try:
                return types.coerce_cli_choice(value, choices=tuple(kind), case_sensitive=info.case_sensitive, ctx=ctx)
            except ValueError:
                return missing
        if kind is str:
            return value
        if kind is int or kind is float:
            if info.clamp or not (digits if kind is int else decimal).fullmatch(value):
                return missing
            number = kind(value)
            if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
                return missing
            return number
        if isinstance(kind, type) and issubclass(kind, Path) and value and types.routes_to_path(kind, info):
            path_type = info.path_type or kind
            if not (isinstance(path_type, type) and issubclass(path_type, Path)):
                return missing
            # Typer's own checks (exists, file/dir, readable...) on the value already a Path
            return types.coerce_cli_path(path_type(value), info, path_type=path_type, param=param, ctx=ctx)
        return missing

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        descriptor: object = None

        def _coerce_value(self, value, param, ctx):
            result = plain_value(self.descriptor, value, param, ctx)
            if result is missing:
                return typers(self.descriptor)._coerce_value(value, param=param, ctx=ctx)
            return result

    def build(descriptor):
        if descriptor.file_annotation is not None or descriptor.is_list or descriptor.is_tuple:
            return typers(descriptor)
        return PlainRuntimeParam(annotation=descriptor.annotation, parameter_info=descriptor.parameter_info,
                                 descriptor=descriptor)

    build.spotctl_plain = True
    core.build_runtime_param = build
