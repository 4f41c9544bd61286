"""How a study's configuration is layered: a named preset, then the caller's overrides."""

from __future__ import annotations

from collections.abc import Mapping

from powertrip.learning.local_optim import LocalOptimizer

__all__ = ["ALL_POLICIES", "PRESETS", "layered_recipe", "preset_values"]


def preset_values(
    presets: Mapping[str, Mapping[str, object]], preset: str | None, overrides: Mapping[str, object]
) -> dict[str, object]:
    """The one way both study modes merge a preset and overrides: the preset's values (named
    after it), then the caller's non-None overrides on top; a local optimizer recipe given over
    a preset's is layered on it (``layered_recipe``)."""
    values: dict[str, object] = {}
    if preset is not None:
        if preset not in presets:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(presets)}")
        values.update(presets[preset], name=preset)
    given = {k: v for k, v in overrides.items() if v is not None}
    if "local_optimizer" in given and values.get("local_optimizer") is not None:
        given["local_optimizer"] = layered_recipe(
            values["local_optimizer"], given["local_optimizer"]
        )
    values.update(given)
    return values


def layered_recipe(
    base: LocalOptimizer | Mapping[str, object], given: LocalOptimizer | Mapping[str, object]
) -> LocalOptimizer:
    """``given`` over a preset's recipe ``base``: the fields the caller set replace the
    preset's, so ``--reset-optimizer-state`` alone keeps the preset's AdamW; naming another
    optimizer starts from that optimizer's defaults (an SGD run inherits no AdamW betas or
    weight decay)."""
    base = LocalOptimizer.model_validate(base)
    given = LocalOptimizer.model_validate(given)
    if given.name != base.name and "name" in given.model_fields_set:
        return given
    fields = given.model_dump(include=given.model_fields_set)
    return LocalOptimizer(**{**base.model_dump(exclude_unset=True), **fields})


ALL_POLICIES = (
    "powertrip",
    "powertrip-paper",
    "static-optimal",
    "select-all",
    "fixed-radius",
    "highest-power",
    "lowest-latency",
    "random",
    "centralized-25",
    "centralized-50",
)

# Both presets use label-skewed sites (Dirichlet 0.3): the paper's EMNIST is partitioned by
# writer, i.e. non-IID; `--partition iid` gives IID sites instead (docs/reproduction.md).
PRESETS: dict[str, dict[str, object]] = {
    "quick": {
        "description": "a one-minute study: 50 sites, 1 repeat, coarse sweep",
        "num_sites": 50,
        "num_samples": 10_000,
        "partition": "dirichlet",
        "static_sweep": (5, 10, 20, 30, 40, 50),
        "policies": (
            "powertrip",
            "powertrip-paper",
            "static-optimal",
            "select-all",
            "centralized-25",
            "centralized-50",
        ),
        "repeats": 1,
        "max_rounds": 80,
        "target_accuracy": 0.45,
    },
    "paper-uniform": {
        "description": "the paper's protocol (Figs. 8-10): 100 sites, uniform power, 1.5 GB, "
        "all policies, 10 repeats",
        "partition": "dirichlet",
        "policies": ALL_POLICIES,
        "repeats": 10,
        "max_rounds": 100,
        "target_accuracy": 0.45,
    },
    "paper-traces": {
        "description": "the paper's Fig. 12: paper-uniform with trace-driven power (the "
        "embedded synthetic-trace; --power-model google-trace --power-trace DIR for real files); "
        "--update-gb 1/1.5/2 gives Fig. 13",
        "partition": "dirichlet",
        "policies": ALL_POLICIES,
        "repeats": 10,
        "max_rounds": 100,
        "target_accuracy": 0.45,
        "power_model": "synthetic-trace",
    },
}
