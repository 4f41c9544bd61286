"""Site training as a ``torch.distributed`` job: one big model per site, trained over the
site's devices (DDP, or FSDP2 where the model does not fit one device). The in-process engines
(``powertrip.learning.engines``) stay for many small sites; this engine is for a site that is a
GPU cluster (docs/site-engine.md). ``RankEngine`` puts a ``SiteGroup`` behind their interface.

The package itself imports nothing heavy (its settings are ``powertrip.config.site_engine``,
torch-free); ``SiteGroup``, ``SiteRoundResult``, ``RankFailed`` and ``RankEngine`` load on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from powertrip.config.site_engine import SiteEngineConfig
    from powertrip.learning.site_engine.engine import RankEngine
    from powertrip.learning.site_engine.group import RankFailed, SiteGroup, SiteRoundResult

__all__ = ["RankEngine", "RankFailed", "SiteEngineConfig", "SiteGroup", "SiteRoundResult"]


def __getattr__(name: str) -> Any:
    if name == "SiteEngineConfig":  # the settings live in the torch-free powertrip.config
        from powertrip.config.site_engine import SiteEngineConfig

        return SiteEngineConfig
    if name in ("RankFailed", "SiteGroup", "SiteRoundResult"):
        from powertrip.learning.site_engine import group

        return getattr(group, name)
    if name == "RankEngine":
        from powertrip.learning.site_engine.engine import RankEngine

        return RankEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
