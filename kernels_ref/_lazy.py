"""Names a package imports on first use: its `__getattr__`, `__dir__` and `__all__` in one place.

A package lists its submodules and, per submodule, the names it re-exports; nothing is imported
until a name is read (so `kernels_ref.dtypes` loads without torch or triton). Plain Python only.
"""

from __future__ import annotations

import importlib


def lazy_exports(package: str, modules, names: dict, namespace: dict):
    """(__getattr__, __dir__, __all__) for `package` whose submodules `modules` are attributes and
    whose `names` ({submodule: (name, ...)}) are read from their submodule on first use and then
    kept in `namespace` (the package's globals())."""
    where = {name: mod for mod, ns in names.items() for name in ns}
    exported = list(modules) + [n for ns in names.values() for n in ns]

    def __getattr__(name):
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(exported))

    return __getattr__, __dir__, exported
