"""Every setting of a run, declared once, as typed models that import no torch.

The bottom of the library: feature modules read these models, never the reverse, and the
front-ends (the ``powertrip`` commands and the services' environment) derive their options
from them.
"""
