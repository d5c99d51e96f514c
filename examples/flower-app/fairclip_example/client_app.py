"""The app's ClientApp: its own training loop. fairclip adds one thing, ``mods=[fairclip_mod]``."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fairclip.flower import fairclip_mod
from fairclip_example.task import load_data, make_model, train

app = ClientApp(mods=[fairclip_mod])  # fairclip: clip the update and add the report bits


@app.train()
def local_training(message: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    x, y = load_data(int(context.node_config["partition-id"]))
    loss = train(model, x, y, float(context.run_config["lr"]))
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": len(y)}),
        }
    )
    return Message(content, reply_to=message)
