"""Registers the ``khal`` build hook with hatchling (entry point group ``hatch``)."""

from __future__ import annotations

from hatchling.plugin import hookimpl

from hatch_khal.plugin import KhalBuildHook


@hookimpl
def hatch_register_build_hook() -> type[KhalBuildHook]:
    return KhalBuildHook
