"""ClientApp: one handler per message type.

query                -> partition id, partition count and n_k (the server keys clients by these);
                        the label histogram only when the server's config asks (diagnostics)
train.discriminator  -> D_k trained against the server's generator (FedGO pre-FL, Algorithm 3)
train                -> ClientUpdate: the global classifier trained on S_k
evaluate             -> the global classifier's loss and accuracy on S_k
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgo_flwr.config import Config
from fedgo_flwr.data import client_data, load_dataset
from fedgo_flwr.gan import train_discriminator as train_d
from fedgo_flwr.models import Discriminator, Generator, create_classifier
from fedgo_flwr.strategies.clients import client_seed
from fedgo_flwr.train import evaluate as evaluate_model
from fedgo_flwr.train import resolve_device, train_classifier

app = ClientApp()


def _local(context: Context):
    """(config, partition id, its images, its labels) of this node."""
    cfg = Config.from_run_config(context.run_config)
    try:
        pid = int(context.node_config["partition-id"])
        k = int(context.node_config["num-partitions"])
    except KeyError as missing:
        raise RuntimeError(f"node config lacks {missing}: start the SuperNode with "
                           "--node-config \"partition-id=<i> num-partitions=<K>\"") from None
    x, y = client_data(cfg, pid, k)
    return cfg, pid, k, x, y


def _classifier(cfg: Config, message: Message) -> torch.nn.Module:
    data = load_dataset(cfg.dataset, cfg.data_path)
    c, h, _ = data.image_shape
    model = create_classifier(cfg.model, c, data.num_classes, h)
    model.load_state_dict(message.content.array_records["arrays"].to_torch_state_dict())
    return model


def _reply(message: Message, metrics: dict, key: str = "metrics",
           **arrays: ArrayRecord) -> Message:
    content = RecordDict({**arrays, key: MetricRecord(metrics)})
    return Message(content, reply_to=message)


@app.query()
def info(message: Message, context: Context) -> Message:
    cfg, pid, k, _, y = _local(context)
    reply = {"partition-id": pid, "num-partitions": k, "num-examples": len(y)}
    conf = message.content.config_records.get("config")
    if conf is not None and conf.get("label-histogram"):
        classes = load_dataset(cfg.dataset, cfg.data_path).num_classes
        reply["label-histogram"] = torch.bincount(y, minlength=classes).tolist()
    return _reply(message, reply, key="info")


@app.train("discriminator")
def train_discriminator(message: Message, context: Context) -> Message:
    cfg, pid, _, x, _ = _local(context)
    conf = message.content.config_records["config"]
    c, h = x.shape[1], x.shape[2]
    generator = Generator(int(conf["latent-dim"]), c, h, int(conf["generator-width"]))
    generator.load_state_dict(message.content.array_records["generator"].to_torch_state_dict())
    seed = client_seed(int(conf["seed"]), pid)
    torch.manual_seed(seed)  # D_k's initialisation
    discriminator = Discriminator(c, h, int(conf["discriminator-width"]))
    result = train_d(discriminator, generator, x, epochs=int(conf["discriminator-epochs"]),
                     lr=float(conf["discriminator-lr"]), batch_size=int(conf["batch-size"]),
                     flip=bool(conf["flip"]), seed=seed,
                     device=resolve_device())
    return _reply(message, {"num-examples": len(x), **result},
                  discriminator=ArrayRecord(discriminator.cpu().state_dict()))


@app.train()
def train(message: Message, context: Context) -> Message:
    cfg, pid, _, x, y = _local(context)
    conf = message.content.config_records["config"]
    model = _classifier(cfg, message)
    result = train_classifier(model, x, y, epochs=int(conf["local-epochs"]),
                              batch_size=int(conf["batch-size"]), lr=float(conf["lr"]),
                              flip=bool(conf["flip"]), seed=client_seed(int(conf["seed"]), pid),
                              device=resolve_device())
    return _reply(message, {"num-examples": len(y), **result},
                  arrays=ArrayRecord(model.cpu().state_dict()))


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    cfg, _, _, x, y = _local(context)
    acc, loss = evaluate_model(_classifier(cfg, message), x, y, device=resolve_device())
    return _reply(message, {"num-examples": len(y), "eval-acc": acc, "eval-loss": loss})
