"""The ClientApp: one emulated datacenter per Flower node.

It answers two kinds of message: ``train`` (local epochs on its MNIST-1D partition with the
local optimizer recipe the server put in the config, ``recipe_from_config``, plain SGD when
there is none; the reply carries the new weights and ``num-examples`` for FedAvg; the node's
optimizer state stays in its ``context.state`` between rounds) and PowerTrip's property query (its
site's power fraction, RTT and bandwidth: ``register_property_query``). A real deployment
would read those three from the SuperNode's ``--node-config``; here node ``partition-id`` i
reports site i of the seeded ``generate_sites`` draw, the same sites the server's report uses.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import TaskConfig, sites, train_node

from powertrip.integrations.flower import (
    recipe_from_config,
    register_property_query,
    site_properties,
)
from powertrip.learning.site_optim import SiteState

STEPS, MOMENTS = "optimizer-steps", "optimizer-moments"  # the node's state between rounds


def load_state(context: Context) -> SiteState | None:
    """The node's local optimizer state from its earlier rounds (None: none yet)."""
    if STEPS not in context.state:
        return None
    steps, moments = context.state[STEPS], context.state[MOMENTS].to_torch_state_dict()
    by_name: dict[str, dict] = {}
    for key, t in moments.items():
        kind, name = key.split("/", 1)
        by_name.setdefault(name, {})[kind] = t
    return SiteState(int(steps["step"]), by_name, int(steps["moment-step"]))


def save_state(context: Context, state: SiteState) -> None:
    """Keep the node's state in ``context.state``, which Flower keeps for the node."""
    moment_step = state.step if state.moment_step is None else state.moment_step
    context.state[STEPS] = ConfigRecord({"step": state.step, "moment-step": moment_step})
    flat = {f"{k}/{n}": t for n, kinds in state.moments.items() for k, t in kinds.items()}
    context.state[MOMENTS] = ArrayRecord(flat)


def make_client_app(cfg: TaskConfig) -> ClientApp:
    """A ClientApp for the run ``cfg`` (the config travels with the app to the Ray actors)."""
    app = ClientApp()
    site_set = sites(cfg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_config["partition-id"])
        params = msg.content["arrays"].to_torch_state_dict()
        config = msg.content["config"]
        recipe = recipe_from_config(config)  # None: plain SGD at the task's lr
        state = load_state(context) if recipe is not None else None
        server_round = int(config["server-round"])
        new, samples, loss, state = train_node(cfg, node, server_round, params, recipe, state)
        if state is not None:
            save_state(context, state)
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
