"""How a site trains as a distributed job: ranks, sharding, precision, compile.

The defaults follow the device: on CUDA a site runs bf16 autocast and ``torch.compile`` (the
fast path); on the CPU it runs float32, eager, which is what the tests and the CPU benchmarks
measure. Every field is a worker setting (``POWERTRIP_SITE_*``) and a CLI flag.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SiteEngineConfig"]


class SiteEngineConfig(BaseModel):
    """One site's distributed training job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(
        1, ge=1, le=64, description="Processes training the site together (one per GPU on CUDA)."
    )
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model; fsdp: FSDP2 fully_shard, for a "
        "model that does not fit one device.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="bf16: autocast to bfloat16 (weights, optimizer state and updates stay "
        "float32); auto: bf16 on CUDA, fp32 on the CPU.",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile the model; auto: on CUDA only (compiling on the CPU costs "
        "more than it saves for short rounds).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each transformer block's activations in the backward pass (less "
        "memory).",
    )
    micro_batch: int | None = Field(
        None,
        ge=1,
        description="Sequences per rank per forward pass; a step's batch is split into "
        "micro-batches of this size and their gradients accumulated (unset: the rank's whole "
        "share at once).",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl on CUDA, gloo on the CPU."
    )
    keep_moments: bool = Field(
        True,
        description="After every round the ranks write the optimizer's moments to files the "
        "parent reads and fresh ranks load (after a rank failure), so a failure does not reset "
        "them; false: the moments live in the ranks only.",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="Seconds a collective waits for a silent rank before the round fails.",
    )

    def resolved_precision(self, device_type: str) -> Literal["fp32", "bf16"]:
        if self.precision != "auto":
            return self.precision
        return "bf16" if device_type == "cuda" else "fp32"

    def resolved_compile(self, device_type: str) -> bool:
        return self.compile == "on" or (self.compile == "auto" and device_type == "cuda")

    def resolved_backend(self, device_type: str) -> Literal["gloo", "nccl"]:
        if self.backend != "auto":
            return self.backend
        return "nccl" if device_type == "cuda" else "gloo"
