"""Service settings that are library fields under the same name, and the old names of the ones
that were renamed to match.

A service's ``POWERTRIP_<FIELD>`` is the library's ``<field>``: derived from the model
(``library_settings``: every field the service runs, none declared again), or, where the
service's code reads it by name, declared with that type (``library_field``). Either way the
description, the constraints and the validators are the library model's own, so a value the
library would refuse is refused when the service starts, with the same message. ``renamed``
keeps an older variable name working for one release: its value moves to the new name, with a
warning.
"""

from __future__ import annotations

import enum
import json
import logging
import types
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from powertrip.config.curtailment import CURTAIL_PRESETS, CurtailmentConfig, build_curtail_config
from powertrip.config.experiment import ExperimentConfig
from powertrip.config.presets import PRESETS

logger = logging.getLogger(__name__)

PREFIX = "POWERTRIP_"


def env_name(field: str) -> str:
    return PREFIX + field.upper()


class LibraryValue:
    """The validator of a setting that is ``model``'s field ``name`` (read as ``prefix`` +
    ``name``): None, an empty variable (for a setting that defaults to unset) or a value the
    library field accepts; text in the environment's forms (``A,B,C`` for a tuple, JSON for a
    model) is parsed first."""

    def __init__(
        self, model: type[BaseModel], name: str, empty_is_unset: bool, prefix: str = ""
    ) -> None:
        self.model, self.name, self.empty_is_unset = model, name, empty_is_unset
        self.prefix = prefix
        self.info: FieldInfo = model.model_fields[name]
        self._adapter: TypeAdapter[Any] | None = None

    def __call__(self, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, str):
            if self.empty_is_unset and not value.strip():
                return None
            value = self._from_text(value)
        if self._adapter is None:
            self._adapter = TypeAdapter(self.info.rebuild_annotation())
        try:
            return self._adapter.validate_python(value)
        except ValidationError as exc:  # a model's field is named: which one of its fields
            err = exc.errors()[0]
            msg = str(err["msg"]).removeprefix("Value error, ")
            where = ".".join(x for x in err["loc"] if isinstance(x, str))
            raise ValueError(f"{where}: {msg}" if where else msg) from None

    def _from_text(self, text: str) -> object:
        kinds = _members(self.info.annotation)
        if any(typing.get_origin(k) is tuple for k in kinds):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if any(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds):
            return json.loads(text)
        return text


def _members(annotation: object) -> tuple[object, ...]:
    """``A | B | None`` -> (A, B); anything else -> (it,)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def library_field(
    model: type[BaseModel], name: str, default: object = None, prefix: str = ""
) -> Any:
    """A setting that is ``model.name``: the library's description, type checks, constraints
    and validators; unset (None) leaves the library's or the preset's value."""
    info = model.model_fields[name]
    field = FieldInfo.from_field(default, description=info.description)
    field.metadata.append(PlainValidator(LibraryValue(model, name, default is None, prefix)))
    return field


def library_settings(
    model: type[BaseModel], names: Iterable[str], module: str, prefix: str = ""
) -> type[BaseModel]:
    """A mixin of settings that are ``model``'s fields ``names``, each read from
    ``POWERTRIP_`` + ``prefix`` + the field's name and unset by default (``library_field``):
    derived, so the service declares none of them again. ``module`` names the service's
    module, where ``--help`` lists them."""
    fields: dict[str, Any] = {}
    for name in names:
        annotation: Any = model.model_fields[name].annotation
        fields[prefix + name] = (annotation | None, library_field(model, name, prefix=prefix))
    mixin: type[BaseModel] = create_model(f"{model.__name__}Settings", __module__=module, **fields)
    return mixin


def library_values(settings: BaseModel, model: type[BaseModel]) -> dict[str, object]:
    """``settings``' values of ``model``'s fields, under the library's names (None: unset)."""
    out = {}
    for name, info in type(settings).model_fields.items():
        source = library_source(info)
        if source is not None and source.model is model:
            out[source.name] = getattr(settings, name)
    return out


def library_source(info: FieldInfo) -> LibraryValue | None:
    """The library field a setting is (``library_field``), or None for the service's own."""
    for m in info.metadata:
        if isinstance(m, PlainValidator) and isinstance(m.func, LibraryValue):
            return m.func
    return None


#: the presets a library model's settings start from (POWERTRIP_PRESET, POWERTRIP_CURTAIL_PRESET)
_PRESETS: dict[type[BaseModel], Mapping[str, Mapping[str, object]]] = {
    ExperimentConfig: PRESETS,
    CurtailmentConfig: CURTAIL_PRESETS,
}


def unset_means(info: FieldInfo) -> str | None:
    """What a library-backed setting left unset is, for the help: the preset's where a preset
    sets the field, else the library field's own default (None: nothing to say)."""
    source = library_source(info)
    if source is None or info.default is not None:
        return None
    if any(source.name in values for values in _PRESETS.get(source.model, {}).values()):
        return "the preset's"
    default = source.info.default
    if source.info.default_factory is not None or default is None:
        return None
    value = default.value if isinstance(default, enum.Enum) else default
    return str(value).lower() if isinstance(value, bool) else str(value)


def renamed(new: str) -> Any:
    """The old name of setting ``new``, still read for one release (``move_renamed``)."""
    return Field(
        None,
        description=f"deprecated: the old name of {env_name(new)}, read until the next release",
        json_schema_extra={"renamed_to": new},
    )


def renamed_to(info: FieldInfo) -> str | None:
    extra = info.json_schema_extra
    new = extra.get("renamed_to") if isinstance(extra, dict) else None
    return new if isinstance(new, str) else None


def move_renamed(cls: type[BaseModel], data: object) -> object:
    """Values given under an old name (``renamed``) move to the new one, with a warning; both
    names at once is an error (which one was meant is unknowable)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, info in cls.model_fields.items():
        new = renamed_to(info)
        if new is None or data.get(old) is None:
            continue
        value = data.pop(old)
        if data.get(new) is not None:
            raise ValueError(f"{env_name(old)} is the old name of {env_name(new)}: set only one")
        logger.warning(
            "%s is deprecated: set %s instead (the old name is read until the next release)",
            env_name(old),
            env_name(new),
        )
        data[new] = value
    return data


#: what the sites' availability needs (the profiler's, and the aggregator's to match)
AVAILABILITY = (
    "carbon_trace_path",
    "regions",
    "sites_per_region",
    "threshold",
    "hold_s",
    "provisioning_s",
    "hours",
)

if TYPE_CHECKING:  # derived at run time; read only through ``curtail_config``
    _Availability = BaseModel
else:
    _Availability = library_settings(CurtailmentConfig, AVAILABILITY, __name__)


class CurtailSettings(_Availability):
    """The curtailment run's availability as services read it from the environment: the
    library's ``CurtailmentConfig`` fields under their own names (POWERTRIP_REGIONS="A,B,C",
    POWERTRIP_THRESHOLD, ...); mixed into the profiler's and the aggregator's settings, so both
    build one ``CurtailmentConfig`` the same way."""

    curtail_preset: str = Field(
        "curtailment", description="the curtailment study's preset (CURTAIL_PRESETS)"
    )
    site_regions: str | None = renamed("regions")
    curtail_threshold: str | None = renamed("threshold")
    curtail_hold_s: str | None = renamed("hold_s")
    curtail_hours: str | None = renamed("hours")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        return move_renamed(cls, data)

    def curtail_config(self, **overrides: object) -> CurtailmentConfig:
        """The preset, these settings and ``overrides`` (unset ones leave the preset's)."""
        values = library_values(self, CurtailmentConfig)
        return build_curtail_config(self.curtail_preset, **{**values, **overrides})
