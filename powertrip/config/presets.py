"""How a study's configuration is layered: a named preset, then the caller's overrides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from powertrip.config.recipe import LocalOptimizer

__all__ = [
    "ALL_POLICIES",
    "DEFAULT_SWEEP_FRACTIONS",
    "default_sweep",
    "PRESETS",
    "layered_recipe",
    "preset_values",
    "rescaled_sweep",
    "scaled_sweep",
]


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
    return _preset_sweep_follows_the_sites(presets.get(preset or "", {}), given, values)


def _preset_sweep_follows_the_sites(
    own: Mapping[str, object], given: Mapping[str, object], values: dict[str, object]
) -> dict[str, object]:
    """A preset's sweep is stated for its own site count: given another ``num_sites`` and no
    sweep, each k keeps its share of the sites (quick's 5..50 of 50 sites is 15..150 at 150
    sites; docs/scale.md). The preset's own study is unchanged."""
    sweep, sites, to_sites = own.get("static_sweep"), own.get("num_sites"), given.get("num_sites")
    if "static_sweep" in given or not isinstance(sweep, tuple | list) or not isinstance(sites, int):
        return values
    if not isinstance(to_sites, int) or to_sites < 1 or to_sites == sites:
        return values
    return {**values, "static_sweep": rescaled_sweep(sweep, sites, to_sites)}


def layered_recipe(base: object, given: object) -> LocalOptimizer:
    """``given`` over a preset's recipe ``base``: the fields the caller set replace the
    preset's, so ``--reset-optimizer-state`` alone keeps the preset's AdamW; naming another
    optimizer starts from that optimizer's defaults (an SGD run inherits no AdamW betas or
    weight decay)."""
    under = LocalOptimizer.model_validate(base)
    over = LocalOptimizer.model_validate(given)
    if over.name != under.name and "name" in over.model_fields_set:
        return over
    fields = over.model_dump(include=over.model_fields_set)
    return LocalOptimizer(**{**under.model_dump(exclude_unset=True), **fields})


# The static sweep's default: a function of the site count. A fixed list does not scale (at 150
# sites a sweep of k <= 50 never reached the target), so the default is 10%, 20%, ..., 100% of
# the sites, rounded half up, at least 1, deduplicated; at 100 sites that is the old fixed
# default (10, 20, ..., 100). docs/scale.md.
DEFAULT_SWEEP_FRACTIONS: tuple[float, ...] = tuple(i / 10 for i in range(1, 11))


def _count(fraction: float, num_sites: int) -> int:
    # round half up (not Python's banker's rounding), so 2.5 sites -> 3
    return min(num_sites, max(1, int(fraction * num_sites + 0.5)))


def scaled_sweep(
    num_sites: int, fractions: Sequence[float] = DEFAULT_SWEEP_FRACTIONS
) -> tuple[int, ...]:
    """Each fraction of ``num_sites`` rounded to a count in 1..num_sites, sorted, deduplicated."""
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"sweep fractions must be in (0, 1], got {tuple(fractions)}")
    return tuple(sorted({_count(f, num_sites) for f in fractions}))


def default_sweep(validated: Mapping[str, object]) -> tuple[int, ...]:
    """The sweep of a configuration given none: ``scaled_sweep`` of its (validated) site count,
    as a data-aware pydantic ``default_factory``."""
    sites = validated.get("num_sites", 100)
    return scaled_sweep(sites if isinstance(sites, int) and sites >= 1 else 100)


def rescaled_sweep(sweep: Sequence[int], from_sites: int, to_sites: int) -> tuple[int, ...]:
    """A sweep stated for ``from_sites`` sites (a preset's) carried to ``to_sites``: each k
    keeps its share of the sites. Unchanged when the site count is."""
    if from_sites == to_sites:
        return tuple(sorted(set(sweep)))
    return scaled_sweep(to_sites, [min(1.0, k / from_sites) for k in sweep])


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
# The paper presets average with the paper's plain FedAvg; every other run gets the robust
# default (docs/robust-aggregation.md: it costs PowerTrip ~8 % time to accuracy on honest sites).
PAPER_PROTOCOL: dict[str, object] = {
    "partition": "dirichlet",
    "policies": ALL_POLICIES,
    "repeats": 10,
    "max_rounds": 100,
    "target_accuracy": 0.45,
    "aggregation": "fedavg",  # the paper's plain mean: its figures (docs/reproduction.md)
}
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
        **PAPER_PROTOCOL,
    },
    "paper-traces": {
        "description": "the paper's Fig. 12: paper-uniform with trace-driven power (the "
        "embedded synthetic-trace; --power-model google-trace --power-trace DIR for real files); "
        "--update-gb 1/1.5/2 gives Fig. 13",
        **PAPER_PROTOCOL,
        "power_model": "synthetic-trace",
    },
}
