"""The update codec a study applies (``ExperimentConfig`` inherits these settings).

The name is checked where the codec is built (``powertrip.codecs.get_codec``, at a run's
start) and by the command line, which offers the registered names as choices."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from powertrip.config.fields import omitted_at_default

__all__ = ["CodecSettings"]


class CodecSettings(BaseModel):
    """Update compression (docs/compression.md); left out of dumps while off, so existing
    summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    codec: str = omitted_at_default(
        "none",
        "Update codec: none, int8, int4, fp8 or topk-<p> (p% largest entries); the "
        "selection and the time model price the update at its compressed size "
        "(docs/compression.md).",
    )
    error_feedback: bool = omitted_at_default(
        True, "Keep each site's compression error and add it to its next update."
    )
