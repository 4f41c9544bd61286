"""PowerTrip's services. Imported before anything loads gRPC, so this is where gRPC's core
logging is set: ``GRPC_VERBOSITY=ERROR`` (gRPC's documented default; unset, its core logs at
INFO, one line per refused TLS handshake, unthrottled). An explicit setting wins."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
