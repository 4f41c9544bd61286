"""Adapters that run PowerTrip's selection inside other federated-learning frameworks.

Each subpackage is an optional extra with its own third-party dependencies (``flower``:
``pip install 'powertrip[flower]'``). Nothing here is imported by ``import powertrip``, so the
core library stays free of those dependencies, and of the gRPC stack some of them bring along.
"""
