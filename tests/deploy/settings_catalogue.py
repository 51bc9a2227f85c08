"""Which TOOLBUS_* variables each service reads: the fields of every pydantic-settings class in
`toolbus_common` and in the service's own package, found by importing their modules (so a class
added anywhere is seen, not only one named in a list here)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from pydantic_settings import BaseSettings

SERVICES = ("registry", "dispatcher", "approval", "credentials", "gateway")


@cache
def settings_classes(package: str) -> tuple[type[BaseSettings], ...]:
    """Every BaseSettings subclass defined in `package` or its submodules."""
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        modules.append(importlib.import_module(info.name))
    found: dict[str, type[BaseSettings]] = {}
    for module in modules:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value.__module__.startswith(package)
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return tuple(found[name] for name in sorted(found))


def env_names(cls: type[BaseSettings]) -> set[str]:
    """The environment variables a settings class reads (prefix + field name, or its alias)."""
    prefix = cls.model_config.get("env_prefix", "")
    names = set()
    for name, field in cls.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else None
        names.add((alias or f"{prefix}{name}").upper())
    return names


@cache
def service_settings(service: str) -> frozenset[str]:
    """Every TOOLBUS_* variable `python -m toolbus_<service>` reads."""
    names: set[str] = set()
    for cls in (*settings_classes("toolbus_common"), *settings_classes(f"toolbus_{service}")):
        names |= env_names(cls)
    return frozenset(names)


@cache
def all_settings() -> frozenset[str]:
    return frozenset().union(*(service_settings(s) for s in SERVICES))
