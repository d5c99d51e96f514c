"""Plug-ins: clipping policies, models and datasets from the user's own code.

A scenario (TOML, ``--set`` or :mod:`fairclip.api`) names a plug-in by a *reference*, a string
that is looked up in this order:

1. a name registered in this process with :func:`register` (:func:`fairclip.policies.register`
   for policies; :class:`fairclip.Scenario` registers the dataset and model objects it is given);
2. a name that an installed package declares as an entry point, in the group of its kind::

       [project.entry-points."fairclip.policies"]
       hard-schedule = "mypkg.policies:HardSchedule"

   (groups ``fairclip.policies``, ``fairclip.models``, ``fairclip.datasets``);
3. an import path ``"package.module:attribute"``, imported on first use.

What each kind must be is checked where it is used: a policy is a subclass of
:class:`fairclip.policies.Policy`; a model is a factory ``(input_shape, num_classes) ->
torch.nn.Module``; a dataset is a :class:`fairclip.FederatedDataset` or a loader ``(num_clients,
seed, **options) -> FederatedDataset``.

Simulations that run in other processes (``compare`` on Ray) receive the registrations of
this process (:func:`snapshot`, :func:`restore`) and its import path, so a plug-in defined in a
notebook or a script works there too.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from typing import Any, Literal

from fairclip.root_error import FairclipError, describe

Kind = Literal["policy", "model", "dataset"]

ENTRY_POINT_GROUPS: dict[str, str] = {
    "policy": "fairclip.policies",
    "model": "fairclip.models",
    "dataset": "fairclip.datasets",
}
"""The entry-point group of each kind of plug-in."""

_REGISTERED: dict[str, dict[str, Any]] = {kind: {} for kind in ENTRY_POINT_GROUPS}


class PluginError(FairclipError, ValueError):
    """A plug-in reference that cannot be resolved, or an object of the wrong kind; one line."""


def is_import_path(reference: str) -> bool:
    """Whether ``reference`` has the form ``package.module:attribute``."""
    module, separator, attribute = reference.partition(":")
    return bool(separator and module and attribute)


def register(kind: Kind, name: str, obj: Any, *, replace: bool = False) -> None:
    """Make ``obj`` available under ``name`` to the scenarios of this process (and of the
    processes its comparisons start). Registering a taken name again needs ``replace``."""
    _check_kind(kind)
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise PluginError(f"a {kind} name must be a non-empty string without ':' (got {name!r})")
    existing = _REGISTERED[kind].get(name)
    if existing is not None and existing is not obj and not replace:
        raise PluginError(f"a {kind} named {name!r} is already registered (pass replace=True)")
    _REGISTERED[kind][name] = obj


def registered(kind: Kind) -> dict[str, Any]:
    """The objects registered in this process under each name (a copy)."""
    _check_kind(kind)
    return dict(_REGISTERED[kind])


def resolve(kind: Kind, reference: str) -> Any:
    """The object a reference names (module docstring); :class:`PluginError` if none."""
    _check_kind(kind)
    if not isinstance(reference, str) or not reference:
        raise PluginError(f"a {kind} reference must be a non-empty string (got {reference!r})")
    if reference in _REGISTERED[kind]:
        found = _REGISTERED[kind][reference]
        if isinstance(found, _Unavailable):
            raise PluginError(
                f"{kind} {reference!r} was registered in the starting process, but {found.reason}"
            )
        return found
    for entry in entry_points(group=ENTRY_POINT_GROUPS[kind]):
        if entry.name == reference:
            try:
                return entry.load()
            except Exception as error:
                raise PluginError(
                    f"{kind} {reference!r}: entry point {entry.value!r} cannot be loaded ({describe(error)})"
                ) from None
    if is_import_path(reference):
        return import_object(reference, kind)
    raise PluginError(f"unknown {kind} {reference!r}")


def import_object(path: str, kind: str = "object") -> Any:
    """``package.module:attribute`` (the attribute may be dotted) imported; one-line errors."""
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise PluginError(f"{kind} {path!r}: cannot import {module_name!r} ({describe(error)})") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            if module_name == "__main__":
                raise PluginError(MAIN_UNREACHABLE.format(kind=kind, path=path)) from None
            raise PluginError(f"{kind} {path!r}: {module_name!r} has no attribute {attribute!r}") from None
    return target


MAIN_UNREACHABLE = (
    "{kind} {path!r}: it was defined in the script another process runs as __main__, which this "
    "process cannot import; define it in a module both processes import (for example my_research.py "
    "beside the script) and refer to it as 'my_research:Name'"
)
"""The error of a ``__main__:Name`` reference that this process's ``__main__`` does not hold: a
class defined in the script a Flower server or a notebook runs, which a Flower node (another
process, with its own ``__main__``) cannot import."""


def snapshot() -> dict[str, Any]:
    """What another process needs to resolve the same references: the import path of this
    process and its registrations, pickled (with cloudpickle, which also carries functions and
    classes defined in a notebook or a test) so that they are unpickled only once
    :func:`restore` has put the path in place -- a registered class is pickled by reference to
    its module, which the other process may find only on that path."""
    pickler = _pickler()
    registered = {}
    for kind, names in _REGISTERED.items():
        registered[kind] = {}
        for name, obj in names.items():
            try:
                registered[kind][name] = pickler.dumps(obj)
            except Exception as error:  # resolved there, it fails with this reason
                registered[kind][name] = _Unavailable(f"it cannot be pickled ({describe(error)})")
    return {"path": list(sys.path), "registered": registered}


def restore(state: dict[str, Any]) -> None:
    """Take over the import-path entries and the registrations of another process's
    :func:`snapshot` (entries already on this process's path stay where they are)."""
    for entry in state["path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    pickler = _pickler()
    for kind, names in state["registered"].items():
        for name, payload in names.items():
            try:
                obj = payload if isinstance(payload, _Unavailable) else pickler.loads(payload)
            except Exception as error:  # an object this process cannot load; fails if used
                obj = _Unavailable(f"it cannot be loaded here ({describe(error)})")
            _REGISTERED[kind][name] = obj


class _Unavailable:
    """A registration another process made that this one cannot use, and why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _pickler() -> Any:
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - Ray, a dependency, brings it
        import pickle as cloudpickle
    return cloudpickle


def _check_kind(kind: str) -> None:
    if kind not in ENTRY_POINT_GROUPS:
        raise PluginError(f"unknown kind of plug-in {kind!r} (known: {', '.join(ENTRY_POINT_GROUPS)})")
