"""The ClientApp: Flower's PyTorch quickstart, plus one call that adds what FedGO's (and
DaFKD's) server asks of a client besides training."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgo_example.task import Net, load_data, test, train
from fedgo_flwr.client import register

app = ClientApp()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def local_data(context: Context):
    return load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                     context.run_config)


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader = local_data(context)
    config = msg.content["config"]
    loss = train(model, loader, config["local-epochs"], config["lr"], device,
                 proximal_mu=config.get("proximal-mu", 0.0))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = local_data(context).dataset.tensors
    acc, loss = test(model, x, y, device)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


# FedGO's discriminator (Algorithm 3), DaFKD's local step and the guard's scores, on this
# node's data.
register(app, model_fn=Net, data_fn=local_data, device=device)
