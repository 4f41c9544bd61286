"""PowerTrip in a Flower app: the ServerApp, the ClientApp and their shared task."""
