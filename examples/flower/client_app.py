"""The ClientApp: one emulated datacenter per Flower node.

It answers two kinds of message: ``train`` (local epochs on its MNIST-1D partition, the reply
carries the new weights and ``num-examples`` for FedAvg) and PowerTrip's property query (its
site's power fraction, RTT and bandwidth: ``register_property_query``). A real deployment
would read those three from the SuperNode's ``--node-config``; here node ``partition-id`` i
reports site i of the seeded ``generate_sites`` draw, the same sites the server's report uses.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import TaskConfig, sites, train_node

from powertrip.integrations.flower import register_property_query, site_properties


def make_client_app(cfg: TaskConfig) -> ClientApp:
    """A ClientApp for the run ``cfg`` (the config travels with the app to the Ray actors)."""
    app = ClientApp()
    site_set = sites(cfg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_config["partition-id"])
        params = msg.content["arrays"].to_torch_state_dict()
        server_round = int(msg.content["config"]["server-round"])
        new, samples, loss = train_node(cfg, node, server_round, params)
        content = RecordDict(
            {
                "arrays": ArrayRecord(new),
                "metrics": MetricRecord({"num-examples": samples, "train-loss": loss}),
            }
        )
        return Message(content=content, reply_to=msg)

    def properties(context: Context, now_s: float) -> dict[str, Any]:
        node = int(context.node_config["partition-id"])
        return {"partition-id": node, **site_properties(site_set, node, now_s)}

    register_property_query(app, properties)
    return app
