"""FedGAN (Rasouli et al. 2020) as a generator source (FedGO's Table 2, G3): when the server
has no data to train G on, the clients train it. For `fedgan-rounds` rounds the server sends
G and its WGAN-GP critic to the sampled clients; each trains both on its own images for
`fedgan-epochs` local epochs (the critic's passes over its data) and sends them back; the
server averages both by n_k. The final G is then what FedGO's discriminators learn against and
what a generated distillation set is drawn from. Server stage and client handler below; every
ensemble strategy's clients answer it (ENSEMBLE_CLIENT in ensemble.py)."""

from __future__ import annotations

import math
import time
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log

from fedgo_app.client_context import Local, config_of, reply
from fedgo_flwr.gan import train_wgan_gp
from fedgo_app.generators import new_generator
from fedgo_flwr.models import Critic, Generator
from fedgo_flwr.seeds import client_seed, round_seed
from fedgo_app.server.clients import config_record
from fedgo_app.server.record import reply_tally
from fedgo_flwr.sampling import sample_clients
from fedgo_flwr.aggregation import mean
from fedgo_flwr.replies import arrays_problem, examples_problem, payload_bytes
from fedgo_flwr.strategies.rounds import FAILED

TRAIN_FEDGAN = "train.fedgan"
GENERATOR, CRITIC = "generator", "critic"


def fedgan_generator(strategy, grid) -> Generator:
    """G trained by the clients with FedGAN (the pre-FL stage before the discriminators);
    bytes and client seconds are counted as pre-FL; each round's clients and reply tally go
    to the record's pre_fl.generator."""
    cfg, setup, record = strategy.cfg, strategy.setup, strategy.record
    c, h, _ = setup.image_shape
    torch.manual_seed(cfg.seed)
    generator = new_generator(cfg, setup.image_shape)
    critic = Critic(c, h, cfg.generator_width)
    start, stage = time.perf_counter(), {"rounds": []}
    for t in range(1, cfg.fedgan_rounds + 1):
        pids = sample_clients(strategy.clients.partition_ids, cfg.fraction_train,
                              round_seed(cfg.seed, 0), t, absent=strategy.absent)
        expected = {strategy.clients.by_partition[p].node_id: p for p in pids}
        content = RecordDict({
            GENERATOR: ArrayRecord(generator.state_dict()),
            CRITIC: ArrayRecord(critic.state_dict()),
            "config": config_record(fedgan_epochs=cfg.fedgan_epochs, latent_dim=cfg.latent_dim,
                                    generator_width=cfg.generator_width,
                                    critic_steps=cfg.critic_steps, gp_weight=cfg.gp_weight,
                                    gan_lr=cfg.gan_lr, batch_size=cfg.gan_batch_size,
                                    flip=cfg.flip, seed=round_seed(cfg.seed, t))})
        record.sent("pre_fl", "down", payload_bytes([content]) * len(pids))
        log(INFO, "pre-FL: FedGAN round %d/%d on partitions %s", t, cfg.fedgan_rounds, pids)
        replies = strategy.exchange(
            [Message(content, dst_node_id=n, message_type=TRAIN_FEDGAN) for n in expected],
            expected, f"pre-FL: FedGAN round {t}", None)
        record.sent("pre_fl", "up", payload_bytes(replies))
        templates = {GENERATOR: generator.state_dict(), CRITIC: critic.state_dict()}
        usable, tally = checked(strategy, replies, expected, templates)
        record.client_seconds("fedgan", sum(float(m.get("train-seconds", 0.0))
                                            for _, _, m in usable))
        stage["rounds"].append({"clients": pids, **tally})
        if not usable:
            log(WARNING, "pre-FL: FedGAN round %d: no usable reply; G is unchanged", t)
            continue
        n = [strategy.membership.sample_size(p, int(m["num-examples"])) for p, _, m in usable]
        for name, net in ((GENERATOR, generator), (CRITIC, critic)):
            net.load_state_dict(mean([a[name].to_torch_state_dict() for _, a, _ in usable], n,
                                     templates[name]))
    record.time("generator_training", time.perf_counter() - start)
    record.data["pre_fl"]["generator"] = {"source": "fedgan", **stage}
    return generator.cpu().eval()


def checked(strategy, replies: list[Message], expected: dict[int, int], templates: dict
            ) -> tuple[list[tuple[int, object, dict]], dict]:
    """The usable FedGAN replies, (partition, arrays, metrics) in partition order, and the
    tally of the partitions asked (missing, failed, rejected with the reason, usable): each
    must carry G and the critic shaped as sent and a positive num-examples."""
    usable, left = {}, {}
    for reply in replies:
        pid = expected.get(strategy.mailbox.node_of(reply))
        if pid is None or pid in usable or str(pid) in left:
            continue
        why = (FAILED + str(reply.error.reason) if reply.has_error() else
               arrays_problem(reply.content.array_records, templates)
               or examples_problem(reply.content.metric_records.get("metrics"), "num-examples"))
        if why:
            log(WARNING, "pre-FL: FedGAN reply of partition %d left out: %s", pid, why)
            left[str(pid)] = why
        else:
            usable[pid] = (pid, reply.content.array_records,
                           dict(reply.content.metric_records["metrics"]))
    return ([usable[p] for p in sorted(usable)],
            reply_tally(list(expected.values()), list(usable), left))


def fedgan_steps(num_examples: int, epochs: int, batch_size: int, critic_steps: int) -> int:
    """Generator steps of `epochs` local epochs: each epoch is one pass of the critic over
    the client's images, `critic_steps` critic batches per generator step."""
    return max(1, math.ceil(epochs * num_examples / (batch_size * critic_steps)))


def fedgan_update(message: Message, local: Local) -> Message:
    """FedGAN's local step: G and the critic trained on S_k (WGAN-GP), both sent back."""
    conf = config_of(message)
    c, h, _ = local.image_shape
    generator = Generator(int(conf["latent-dim"]), c, h, int(conf["generator-width"]))
    generator.load_state_dict(message.content.array_records[GENERATOR].to_torch_state_dict())
    critic = Critic(c, h, int(conf["generator-width"]))
    critic.load_state_dict(message.content.array_records[CRITIC].to_torch_state_dict())
    batch, critic_steps = int(conf["batch-size"]), int(conf["critic-steps"])
    info = train_wgan_gp(generator, critic, local.x,
                         steps=fedgan_steps(len(local.x), int(conf["fedgan-epochs"]), batch,
                                            critic_steps),
                         critic_steps=critic_steps, gp_weight=float(conf["gp-weight"]),
                         lr=float(conf["gan-lr"]), batch_size=batch, flip=bool(conf["flip"]),
                         seed=client_seed(int(conf["seed"]), local.partition_id),
                         device=local.device)
    return reply(message, {"num-examples": len(local.x), "train-seconds": info["seconds"],
                           "generator-steps": info["generator-steps"]},
                 **{GENERATOR: ArrayRecord(generator.cpu().state_dict()),
                    CRITIC: ArrayRecord(critic.cpu().state_dict())})
