"""The model families vvs decodes, by name: ``--model NAME`` and an engine folder's ``model.family`` look a family
up here, and nothing outside this table and the families' own packages names one. Adding a family is a new
package under ``vvs/families/`` and one line below (docs/architecture.md, "Adding a family")."""
from __future__ import annotations

from vvs.errors import VVSError
from vvs.families.base import Family
from vvs.families.janus_pro.family import FAMILY as JANUS_PRO
from vvs.families.llamagen.family import FAMILY as LLAMAGEN
from vvs.families.lumina_mgpt.family import FAMILY as LUMINA_MGPT
from vvs.families.mar.family import FAMILY as MAR

FAMILIES: dict[str, Family] = {f.name: f for f in (LLAMAGEN, MAR, JANUS_PRO, LUMINA_MGPT)}
DEFAULT = LLAMAGEN.name


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise VVSError(f"model family {name!r}: unknown; choose one of {', '.join(FAMILIES)}") from None


def family_of(manifest: dict) -> Family:
    """The family of an engine folder (its manifest is already checked, so the name is known)."""
    return FAMILIES[manifest["model"]["family"]]


def pipeline_of(engines, manifest: dict, **options):
    """The pipeline of a folder's family over its engines (``max_batch``, ``max_queue``)."""
    return family_of(manifest).call("pipeline", engines, **options)
