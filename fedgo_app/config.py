"""One typed, validated configuration built from Flower's flat run config.

Every key is declared once, below (the keys every strategy shares) or in its strategy's module
(`<strategy>-<field>`, e.g. `fedprox-mu`), with `keys.key(default, meaning, allowed, groups)`;
pyproject.toml mirrors the defaults under `[tool.flwr.app.config]` (a test keeps them equal)
and docs/configuration.md is generated from the declarations (a test keeps it current). Keys
are kebab-case there and snake_case here.

The config validates against the registries (strategies, datasets, models, weighting rules),
which never import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fedgo_flwr.aggregation import AGGREGATORS, Aggregation
from fedgo_flwr.architectures import parse_client_models
from fedgo_app.attacks import ATTACKS, COLLUDING, byzfl_problem, well_formed_ids
from fedgo_flwr.defences import SCREENS
from fedgo_app.data import DATASETS, PARTITIONERS, dataset_name_problem
from fedgo_flwr.distill import DISTILL_BUDGETS, DISTILL_SETS, ENSEMBLE_SPACES, GUARDS, VIEW_DRAWS
from fedgo_flwr.gan import CALIBRATIONS, NEGATIVES
from fedgo_app.generators import GENERATOR_SOURCES
from fedgo_flwr.keys import (AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, Allowed,
                             ConfigError, Declared, OneOf, check, check_fields, choice, coerce,
                             declared, key)
from fedgo_flwr.models import CLASSIFIERS, model_name_problem
from fedgo_flwr.train import OPTIMIZERS
from fedgo_app.strategies import STRATEGIES
from fedgo_flwr.weighting import WEIGHTINGS

__all__ = ["Config", "ConfigError", "GROUPS", "check", "choice"]

def unknown_keys_problem(unknown: list[str], known) -> str:
    """One line naming each unknown key and the declared keys it is close to."""
    def close(name: str) -> str:
        near = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
        return f"{name!r} (close: {', '.join(near)})" if near else repr(name)
    return (f"unknown run-config key{'s' if len(unknown) > 1 else ''} "
            f"{'; '.join(close(k) for k in unknown)}; every key is in docs/configuration.md")


def client_models_ok(text: str) -> bool:
    if not text.strip():
        return True
    try:
        return all(model_name_problem(name) is None for name, _ in parse_client_models(text))
    except ValueError:
        return False


# Groups of keys: a key's first group is its section in the reference. Every strategy reads
# the first six; the others are read by the strategies that name them (StrategySpec.reads),
# and a strategy's own keys form a group of its name.
GROUPS = {
    "run": "What runs",
    "data": "Data",
    "rounds": "Main FL rounds",
    "nodes": "Nodes, checkpoints and resume",
    "device": "Where the server computes",
    "robustness": "Robust aggregation and Byzantine clients",
    "distillation": "The server update every ensemble strategy shares",
    "weighting": "FedGO's weighting rule",
    "generator": "The generator G (FedGO's pre-FL stage, DaFKD)",
    "pre-fl": "FedGO's pre-FL stage (Algorithm 3)",
}
EVERY_STRATEGY = ("run", "data", "rounds", "nodes", "device", "robustness")


@dataclass(frozen=True)
class Config:
    # --- what runs
    strategy: str = key("fedgo", "the method; see the strategies table in the README",
                        OneOf(STRATEGIES))
    dataset: str = key("fmnist", "the dataset: fmnist, cifar10, cifar100 (torchvision's "
                       "classes, from data-dir, else downloaded), imagenet100 (downsampled, an "
                       "ImageFolder tree <data-dir>/imagenet100/{train,val}/<wnid>/) or folder (an "
                       "ImageFolder tree: "
                       "<data-dir>/train/<class>/<image> and <data-dir>/test/<class>/<image>), or "
                       "a Hugging Face dataset, \"hub:<name or local path>\" (flwr-datasets' "
                       "FederatedDataset; its train and test splits)",
                       Allowed(f"one of {', '.join(DATASETS)}, or \"hub:<name or path>\"",
                               lambda v: dataset_name_problem(v) is None))
    server_dataset: str = key("", "the dataset the server's unlabeled set U comes from (its "
                              "server half); \"\" = `dataset` (FedGO's Table 7 uses CIFAR-100 "
                              "for CIFAR-10 clients)",
                              Allowed(f"\"\", one of {', '.join(DATASETS)} or \"hub:<name>\"",
                                      lambda v: v == "" or dataset_name_problem(v) is None),
                              ("distillation",))
    image_size: int = key(0, "resize every image to this side (bilinear); 0 = as stored (a "
                          "folder's images must then share one size)", NON_NEGATIVE)
    model: str = key("cnn", "the classifier: cnn (FedAvg's CNN), mlp (its 2NN), resnet18, "
                     "resnet50, vgg11-bn (CIFAR variants, batch norm), or your own as "
                     "\"package.module:Callable\" (called with channels, num_classes, "
                     "image_size; returns an nn.Module)",
                     Allowed(f"one of {', '.join(CLASSIFIERS)}, or \"package.module:Callable\"",
                             lambda v: model_name_problem(v) is None))
    client_models: str = key("", "heterogeneous clients: architectures and their shares of the "
                             "partitions, \"cnn:0.5,resnet18:0.5\" (a seeded assignment; each "
                             "architecture has its own global model); empty: every client runs "
                             "`model`", Allowed("<model>:<share>,... with registered models or "
                                                "import paths", client_models_ok))
    seed: int = key(0, "fixes the split, the partitions, client sampling and every "
                    "initialisation", NON_NEGATIVE)
    partition_seed: int = key(-1, "seed of the partitioner alone; -1 = `seed`")
    data_dir: str = key("", "where the data is looked for and put; \"\" = $FEDGO_DATA_DIR or "
                        "~/.cache/fedgo-flwr/data")
    results_dir: str = key("", "absolute results root; \"\" = $FEDGO_RESULTS_DIR or "
                           "~/fedgo-flwr-results")
    run_name: str = key("", "the run's folder under results-dir; \"\" = "
                        "<strategy>-<dataset>-a<alpha>-s<seed>-<time>")
    # --- data
    partitioner: str = key("dirichlet", "how the client pool is divided among the clients "
                           "(flwr-datasets' partitioners): dirichlet (label skew, the paper), "
                           "iid, pathological (classes-per-client classes each), shard "
                           "(shards-per-client label-sorted shards each), linear, square, "
                           "exponential (IID labels, sizes growing with the partition id)",
                           OneOf(PARTITIONERS), ("data",))
    alpha: float = key(0.1, "Dirichlet concentration of the client split (partitioner = "
                       "dirichlet)", POSITIVE, ("data",))
    classes_per_client: int = key(2, "classes each client holds (partitioner = pathological)",
                                  AT_LEAST_ONE, ("data",))
    shards_per_client: int = key(2, "label-sorted shards each client holds (partitioner = "
                                 "shard)", AT_LEAST_ONE, ("data",))
    flip: bool = key(True, "random horizontal flip of client data and U (paper, App. E.2)",
                     groups=("data",))
    random_crop: int = key(0, "client training images padded by this many pixels and randomly "
                           "cropped back (the paper's CIFAR augmentation: 4); 0 = none",
                           NON_NEGATIVE, ("data",))
    test_size: int = key(2000, "test images used for evaluation (a seeded subset); 0 = all",
                         NON_NEGATIVE, ("data",))
    distill_size: int = key(3000, "images of U used for distillation (a seeded subset); "
                            "0 = all of U", NON_NEGATIVE, ("distillation",))
    val_size: int = key(0, "labelled server images outside U, for FedDF-as-published's early "
                        "stopping or distillation-guard = labelled-val (only with one of them)",
                        NON_NEGATIVE, ("feddf", "distillation"))
    # --- main FL (Algorithm 2)
    num_server_rounds: int = key(5, "T, the number of rounds", AT_LEAST_ONE, ("rounds",))
    fraction_train: float = key(0.4, "C: a round trains floor(C K) clients, at least two "
                                "(all when fewer are present)", FRACTION, ("rounds",))
    local_epochs: int = key(1, "client training epochs a round", NON_NEGATIVE, ("rounds",))
    personal_test_fraction: float = key(
        0.0, "share of each client's data held out as its personal test split (seeded; it "
        "never trains); > 0: after every round each client scores the global model on it, "
        "recorded as personalised_test_acc (n_k-weighted); 0 = off, every image trains",
        Allowed("in [0, 1)", lambda v: 0 <= v < 1), ("rounds",))
    batch_size: int = key(64, "client training batch size", AT_LEAST_ONE, ("rounds",))
    lr: float = key(1e-3, "client learning rate", POSITIVE, ("rounds",))
    optimizer: str = key("adam", "how classifiers are trained, by the clients and in the "
                         "server's distillation: adam (the paper's main tables) or sgd with "
                         "`momentum` (its Table 8, VGG11 at lr 0.01)", OneOf(OPTIMIZERS),
                         ("rounds",))
    momentum: float = key(0.9, "SGD momentum (optimizer = sgd)", Allowed(
        "in [0, 1)", lambda v: 0 <= v < 1), ("rounds",))
    round_timeout: float = key(3600.0, "seconds a round (and the pre-FL exchange) waits for "
                               "replies; who did not answer is logged and recorded", POSITIVE,
                               ("rounds",))
    # --- aggregation (fedgo_flwr/aggregation.py)
    aggregator: str = key("mean", "how the round's client models become one model (the model "
                          "FedAvg keeps and distillation starts from): mean (n_k-weighted, the "
                          "papers'), or Flower's robust median, trimmed-mean, krum, multi-krum, "
                          "bulyan", OneOf(AGGREGATORS), ("robustness",))
    aggregator_byzantine: int = key(0, "f, the Byzantine models among a round's that krum, "
                                    "multi-krum and bulyan tolerate (bulyan needs 4f + 3 "
                                    "models a round)", NON_NEGATIVE, ("robustness",))
    aggregator_select: int = key(0, "models multi-krum averages; 0 = n - f", NON_NEGATIVE,
                                 ("robustness",))
    aggregator_trim: float = key(0.2, "share of each tail trimmed-mean cuts per coordinate",
                                 Allowed("in [0, 0.5)", lambda v: 0 <= v < 0.5),
                                 ("robustness",))
    sample_size_cap: float = key(0.0, "n_k weighs at most this many times the median n_k of "
                                 "discovery (a client cannot buy weight by inflating it); "
                                 "0 = no cap, the papers", NON_NEGATIVE, ("robustness",))
    discriminator_screen: str = key("none", "FedGO: leave out of the odds each D_k whose odds "
                                    "on U are saturated, constant or far from the rest "
                                    "(fedgo_flwr/defences.py); none = the paper",
                                    OneOf(SCREENS), ("pre-fl",))
    discriminator_screen_z: float = key(3.5, "robust standard deviations from the median "
                                        "mean odds beyond which discriminator-screen flags a "
                                        "D_k", POSITIVE, ("pre-fl",))
    attack: str = key("none", "what the Byzantine clients do (fedgo_app/attacks.py): none, "
                      "discriminator-max (the paper's), sign-flip, scale, gaussian, label-flip, "
                      "inflate-examples, alie, ipm (ByzFL's, an optional extra)",
                      OneOf(ATTACKS), ("robustness",))
    byzantine_clients: int = key(0, "how many clients lie: a seeded choice of that many "
                                 "partitions", NON_NEGATIVE, ("robustness",))
    byzantine_partitions: str = key("", "which clients lie, by partition id (\"0,3,7\"); "
                                    "instead of byzantine-clients",
                                    Allowed("a comma-separated list of partition ids",
                                            well_formed_ids), ("robustness",))
    attack_scale: float = key(1.0, "s of the attack: sign-flip sends theta_g - s Delta, scale "
                              "theta_g + s Delta, gaussian theta_g + N(0, s^2)", POSITIVE,
                              ("robustness",))
    # --- nodes, checkpoints
    join_timeout: float = key(300.0, "seconds to wait for every partition's node before the "
                              "pre-FL stage; then the run goes on with those that answered (a "
                              "node that is connected has round-timeout to answer)",
                              POSITIVE, ("nodes",))
    require_all_clients: bool = key(False, "fail instead of going on without a partition "
                                    "missing at the start (or without its discriminator)",
                                    groups=("nodes",))
    checkpoint_keep: int = key(1, "checkpoints kept in <run>/checkpoints (the newest; one is "
                               "written after every round); 0 = none", NON_NEGATIVE,
                               ("nodes",))
    resume_from: str = key("", "a checkpoint, or a run folder (its newest checkpoint), to go "
                           "on from, with the same config", groups=("nodes",))
    # --- the server update every ensemble-distillation strategy shares
    server_epochs: int = key(1, "E_s: passes over U a round", NON_NEGATIVE, ("distillation",))
    server_lr: float = key(1e-3, "server learning rate (Adam)", POSITIVE, ("distillation",))
    server_batch_size: int = key(64, "server distillation batch size", AT_LEAST_ONE,
                                 ("distillation",))
    distill_schedule: str = key("cosine", "the server learning rate over the T rounds: cosine "
                                "(the paper's main tables) or constant (its Table 11)",
                                OneOf(("cosine", "constant")), ("distillation",))
    weighting: str = key("odds", "FedGO's client weighting rule: odds (FedGO), uniform (FedDF), "
                         "variance (Fed-ET), entropy (FedHKT/FedDS), domain-aware (DaFKD), "
                         "odds-unsquashed (the odds without FedGO's second sigmoid, whose cap e "
                         "bounds any odds ratio), class-count (each client weighted by its count "
                         "of the class the ensemble predicts, iterated from the uniform "
                         "ensemble; clients then send their label counts); the last two are "
                         "not in the paper",
                         OneOf(WEIGHTINGS), ("weighting",))
    entropy_tau: float = key(1.0, "temperature of the entropy rule (also in the diagnostics)",
                             POSITIVE, ("weighting", "distillation"))
    odds_beta: float = key(1.0, "sharpened odds, w_k ~ n_k Phi_k^beta (odds-unsquashed: "
                           "its inverse temperature); 1 = the paper",
                           POSITIVE, ("weighting",))
    averaged_share: float = key(0.0, "the round's averaged model as one more teacher holding "
                                "this share of the ensemble's weight everywhere (the clients "
                                "share the rest by the rule); 0 = the paper; not in the paper",
                                Allowed("in [0, 1)", lambda v: 0 <= v < 1), ("distillation",))
    past_teachers: int = key(0, "the last P global models (those of rounds t-P to t-1, none "
                             "before round 1's) as more teachers, each holding the share a "
                             "member holds on average, 1/(K + P) of the weight everywhere (the "
                             "clients share the rest by the rule); 0 = the papers; not in the "
                             "papers", NON_NEGATIVE, ("distillation",))
    distill_set: str = key("server-data", "what the server distils on: server-data (U, the "
                           "paper's main tables) or generated (distill-size images drawn from G "
                           "once after the pre-FL stage, FedGO's Table 2 D2); every ensemble "
                           "strategy distils on the same set", OneOf(DISTILL_SETS),
                           ("distillation",))
    redraw_distill_set: bool = key(False, "with distill-set = generated: draw a new set from G "
                                   "every round (seeded by the round) instead of once",
                                   groups=("distillation",))
    generator_source: str = key("train-on-u", "where G comes from: train-on-u (WGAN-GP on U, the "
                                "paper's G1), load (generator-file, an off-the-shelf G: G2) or "
                                "fedgan (trained by the clients, FedGAN: G3)",
                                OneOf(GENERATOR_SOURCES), ("distillation",))
    fedgan_rounds: int = key(5, "FedGAN rounds of generator-source = fedgan (the paper: 5)",
                             AT_LEAST_ONE, ("distillation",))
    fedgan_epochs: int = key(3, "local epochs of G and its critic in each FedGAN round (the "
                             "paper: 3)", AT_LEAST_ONE, ("distillation",))
    generator_file: str = key("", "the generator file of generator-source = load (python -m "
                              "fedgo_lab.export_generator writes one)", groups=("distillation",))
    distillation_guard: str = key(
        "none", "none (the papers), clients: after distilling, as many clients as trained, "
        "drawn from those that did not train this round, score the averaged and the distilled "
        "model on their own data, and the server keeps the distilled one only if its "
        "n_k-weighted accuracy is higher (one more exchange a round; the server still reads no "
        "label), or labelled-val: the server scores both on its val-size LABELLED images "
        "instead (the data FedDF as published validates on); not in the papers",
        OneOf(GUARDS), ("distillation",))
    teacher_floor: bool = key(False, "the round's averaged model as the floor of its teacher: "
                              "on an image where it is surer than the ensemble (a higher top "
                              "probability) its own prediction is the pseudo-label; not in the "
                              "papers", groups=("distillation",))
    confidence_threshold: float = key(0.0, "distil only on the images whose pseudo-label's top "
                                      "probability is at least this (fewer images a step, the "
                                      "same steps); 0 = every image, the papers",
                                      Allowed("in [0, 1)", lambda v: 0 <= v < 1),
                                      ("distillation",))
    distill_budget: str = key("full", "the distillation's steps a round: full (server-epochs "
                              "passes, the papers) or disagreement (that share of them which "
                              "is the share of the images it meets where the averaged model's "
                              "class is not the pseudo-label's, so distillation fades as the "
                              "ensemble and the server model agree; reads no label; not in the "
                              "papers; it cuts the steps before confidence-threshold drops "
                              "images)", OneOf(DISTILL_BUDGETS), ("distillation",))
    budget_probe: int = key(0, "with distill-budget = disagreement: measure the disagreement on "
                            "the distillation's first this many images (whole minibatches) "
                            "and pseudo-label only the steps the budget keeps, not every image "
                            "the full distillation would meet; 0 = measure it on all of them "
                            "(they are all labelled); not in the papers", NON_NEGATIVE,
                            ("distillation",))
    view_draw: str = key("per-pass", "with flip: each image's view (as is or mirrored) in the "
                         "distillation's minibatches, drawn anew in every pass (per-pass, up to "
                         "both views labelled a round) or once a round (per-round: the teachers "
                         "label |U| images, half the work at server-epochs >= 2; not in the "
                         "papers)", OneOf(VIEW_DRAWS), ("distillation",))
    ensemble_test: bool = key(True, "score the weighted ensemble on the test split every round "
                              "(ensemble_test_acc beside the server model's; always with "
                              "diagnostics); false saves the teachers' test forwards, which no "
                              "algorithm reads", groups=("distillation",))
    ensemble_space: str = key("logits", "where the weights mix the clients: logits "
                              "(Algorithm 2) or probabilities (Theorem 3.4)",
                              OneOf(ENSEMBLE_SPACES), ("distillation",))
    diagnostics: bool = key(False, "per round, every weighting rule on the same client models, "
                            "the label oracle and Phi statistics; clients then send their label "
                            "histogram, which no algorithm reads", groups=("distillation",))
    # --- pre-FL stage (generator G1 and discriminators, Algorithm 3)
    generator_steps: int = key(60, "WGAN-GP generator steps on U; 0 = randomly initialised G",
                               NON_NEGATIVE, ("pre-fl",))
    critic_steps: int = key(5, "WGAN-GP critic steps per generator step", AT_LEAST_ONE,
                            ("pre-fl",))
    gp_weight: float = key(10.0, "WGAN-GP gradient penalty weight", NON_NEGATIVE, ("pre-fl",))
    gan_lr: float = key(2e-4, "GAN learning rate (Adam)", POSITIVE, ("generator",))
    gan_batch_size: int = key(64, "WGAN-GP and discriminator batch size", AT_LEAST_ONE,
                              ("pre-fl",))
    latent_dim: int = key(128, "G's latent dimension", AT_LEAST_ONE, ("generator",))
    generator_width: int = key(32, "base channels of G and its critic (64 in WGAN-GP)",
                               AT_LEAST_ONE, ("generator",))
    discriminator_width: int = key(32, "base channels of D_k (64 in DCGAN)", AT_LEAST_ONE,
                                   ("pre-fl",))
    discriminator_epochs: int = key(2, "epochs of each client's discriminator training",
                                    NON_NEGATIVE, ("pre-fl",))
    discriminator_lr: float = key(2e-4, "discriminator learning rate (Adam)", POSITIVE,
                                  ("pre-fl",))
    discriminator_negatives: str = key(
        "generator", "what each D_k learns to tell its images from: generator (samples of G, "
        "the paper) or server-sample (server-sample-size images of U sent once instead of G, "
        "for a server that may share U; no generator is trained; not in the paper)",
        OneOf(NEGATIVES), ("pre-fl",))
    server_sample_size: int = key(3000, "images of U sent to each client with "
                                  "discriminator-negatives = server-sample", AT_LEAST_ONE,
                                  ("pre-fl",))
    discriminator_calibration: str = key(
        "none", "none (the paper) or platt: each client holds out calibration-fraction of its "
        "images from D_k's training, fits log Phi_k = a * logit + b (a > 0) on them against as "
        "many negatives and sends (a, b); the odds lose the paper's cap e (not in the paper)",
        OneOf(CALIBRATIONS), ("pre-fl",))
    calibration_fraction: float = key(0.1, "share of each client's images held out to calibrate "
                                      "D_k (discriminator-calibration = platt)",
                                      Allowed("in (0, 1)", lambda v: 0 < v < 1), ("pre-fl",))
    generator_cache: bool = key(True, "reuse a generator trained before on the same U with the "
                                "same settings and seed, from <results-dir>/generators",
                                groups=("pre-fl",))
    # --- where server work runs
    server_device: str = key("auto", "the server's device: auto (CUDA if visible), cpu, cuda",
                             OneOf(("auto", "cpu", "cuda")), ("device",))
    server_amp: bool = key(True, "bf16 mixed precision for the server's forward passes on a "
                           "GPU; no effect on the CPU", groups=("device",))
    # --- the keys strategies declare (kebab-case -> value), each strategy's defaults to start
    strategy_keys: dict = field(default_factory=lambda: strategy_defaults(), hash=False)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "Config":
        """Build from Flower's run config (kebab-case keys); unknown keys are an error."""
        known = declared_keys()
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(unknown_keys_problem(unknown, known))
        values, strategy_keys = {}, strategy_defaults()
        for name, value in run_config.items():
            d = known[name]
            if name in SHARED_NAMES:
                values[d.field] = coerce(name, value, d.kind)
            else:
                strategy_keys[name] = coerce(name, value, d.kind)
        cfg = cls(**values, strategy_keys=strategy_keys)
        cfg.validate()
        return cfg

    def to_run_config(self) -> dict[str, Any]:
        shared = {d.name: getattr(self, d.field) for d in SHARED}
        return {**shared, **self.strategy_keys}

    def replace(self, **changes: Any) -> "Config":
        """A copy with some keys changed, snake_case (`feddf_published=True` sets a strategy's
        key `feddf-published`)."""
        own, theirs = dict(self.strategy_keys), {d.name: d for d in strategy_declared()}
        for name in [n for n in changes if n not in SHARED_FIELDS]:
            kebab = name.replace("_", "-")
            if kebab not in theirs:
                raise ConfigError(f"unknown run-config key {kebab!r}")
            own[kebab] = coerce(kebab, changes.pop(name), theirs[kebab].kind)
        cfg = dataclasses.replace(self, **changes, strategy_keys=own)
        cfg.validate()
        return cfg

    def keys(self, strategy: str):
        """The keys `strategy` declares, as its keys dataclass (defaults where unset)."""
        spec = STRATEGIES[strategy]
        return spec.keys(**{d.field: self.strategy_keys[d.name]
                            for d in declared(spec.keys, spec.name)})

    def unread_keys(self) -> list[str]:
        """Keys set away from their default that the chosen strategy never reads."""
        reads = {*EVERY_STRATEGY, *STRATEGIES.reads(self.strategy, self.strategy_keys)}
        given = self.to_run_config()
        return [name for name, d in declared_keys().items()
                if given[name] != d.default and not reads.intersection(d.groups)]

    # --- derived values
    @property
    def effective_partition_seed(self) -> int:
        return self.seed if self.partition_seed < 0 else self.partition_seed

    @property
    def aggregation(self) -> Aggregation:
        return Aggregation(self.aggregator, self.aggregator_byzantine, self.aggregator_select,
                           self.aggregator_trim)

    @property
    def calibrated_odds(self) -> bool:
        """The discriminators are calibrated: their odds have no cap e."""
        return self.discriminator_calibration != "none"

    @property
    def data_path(self) -> Path:
        default = os.environ.get("FEDGO_DATA_DIR") or "~/.cache/fedgo-flwr/data"
        return Path(self.data_dir or default).expanduser().resolve()

    @property
    def results_path(self) -> Path:
        default = os.environ.get("FEDGO_RESULTS_DIR") or "~/fedgo-flwr-results"
        return Path(self.results_dir or default).expanduser().resolve()

    @property
    def reads_server_data(self) -> bool:
        """Whether the server opens its unlabeled set U: not when it distils on a generated set
        from a generator it did not train on U (FedGO's S2 rows)."""
        return (self.distill_set == "server-data" or self.generator_source == "train-on-u"
                or self.discriminator_negatives == "server-sample")

    def validate(self) -> None:
        check_fields(self)
        if self.generator_source == "load" and not self.generator_file:
            raise ConfigError("run-config key 'generator-source' is 'load' and "
                              "'generator-file' is empty: name the generator file")
        if self.attack in COLLUDING and (why := byzfl_problem()):
            raise ConfigError(f"run-config key 'attack' is {self.attack!r}, which {why}")
        liars = self.byzantine_clients > 0 or bool(self.byzantine_partitions.strip())
        if self.byzantine_clients > 0 and self.byzantine_partitions.strip():
            raise ConfigError("run-config keys 'byzantine-clients' and 'byzantine-partitions' "
                              "both name the liars: set one")
        if (self.attack == "none") == liars:
            raise ConfigError(f"run-config key 'attack' is {self.attack!r} while "
                              f"'byzantine-clients' is {self.byzantine_clients} and "
                              f"'byzantine-partitions' is {self.byzantine_partitions!r}: name "
                              "both the attack and the clients that make it, or neither")
        if self.redraw_distill_set and self.distill_set != "generated":
            raise ConfigError("run-config key 'redraw-distill-set' is true and 'distill-set' "
                              f"is {self.distill_set!r}: only a generated set (distill-set = "
                              "\"generated\") can be redrawn")
        if self.distill_set == "generated" and self.distill_size == 0:
            raise ConfigError("run-config key 'distill-set' is 'generated' and 'distill-size' "
                              "is 0 (all of U): say how many images to draw from G")
        if self.budget_probe and self.distill_budget != "disagreement":
            raise ConfigError(f"run-config key 'budget-probe' is {self.budget_probe} and "
                              f"'distill-budget' is {self.distill_budget!r}: a probe measures "
                              "the disagreement budget; set distill-budget = \"disagreement\" "
                              "or budget-probe = 0")
        if self.distillation_guard == "labelled-val" and self.val_size == 0:
            raise ConfigError("run-config key 'distillation-guard' is 'labelled-val' and "
                              "'val-size' is 0: say how many labelled server images score the "
                              "averaged and the distilled model")
        if self.discriminator_calibration != "none" and self.weighting == "odds-unsquashed":
            raise ConfigError("run-config key 'weighting' is 'odds-unsquashed', which recovers "
                              "D_k's logit from the paper's capped odds; with "
                              "'discriminator-calibration' = "
                              f"{self.discriminator_calibration!r} the odds are already "
                              "uncapped: use weighting = \"odds\"")
        for name, spec in STRATEGIES.items():  # each strategy checks its own keys
            if spec.keys is not None:
                own = self.keys(name)
                check_fields(own, name)
                if hasattr(own, "validate"):
                    own.validate(self, STRATEGIES)


# The shared keys, declared above; the strategies' keys are read from the registry each time
# (a strategy may be registered after import).
SHARED = declared(Config)
SHARED_FIELDS = {d.field for d in SHARED}
SHARED_NAMES = {d.name for d in SHARED}


def strategy_declared() -> list[Declared]:
    """Every key the registered strategies declare, `<strategy>-<field>`."""
    return [d for name, spec in STRATEGIES.items() if spec.keys is not None
            for d in declared(spec.keys, name)]


def declared_keys() -> dict[str, Declared]:
    """Every run-config key, kebab-case -> its declaration."""
    return {d.name: d for d in [*SHARED, *strategy_declared()]}


def strategy_defaults() -> dict[str, Any]:
    return {d.name: d.default for d in strategy_declared()}
