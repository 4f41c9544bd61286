"""Site training as a ``torch.distributed`` job: one big model per site, trained over the
site's devices (DDP, or FSDP2 where the model does not fit one device). The batched ``vmap``
engine stays for many small sites; this engine is for a site that is a GPU cluster."""
