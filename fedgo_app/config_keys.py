"""The run-config keys every strategy shares, one dataclass a group (the reference's sections),
each declared once with `keys.key(default, meaning, allowed, groups)`; `config.Config` adds
the strategies' own."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.attacks import ATTACKS, well_formed_ids
from fedgo_app.data import DATASETS, PARTITIONERS, dataset_name_problem
from fedgo_app.generators import GENERATOR_SOURCES
from fedgo_app.strategies import STRATEGIES
from fedgo_flwr.aggregation import AGGREGATORS
from fedgo_flwr.architectures import client_models_ok
from fedgo_flwr.budget import DISTILL_BUDGETS
from fedgo_flwr.calibration import CALIBRATIONS
from fedgo_flwr.defences import SCREENS
from fedgo_flwr.distill import DISTILL_SETS, ENSEMBLE_SPACES, GUARDS, VIEW_DRAWS
from fedgo_flwr.gan import NEGATIVES
from fedgo_flwr.keys import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, Allowed, OneOf, key
from fedgo_flwr.models import CLASSIFIERS, model_name_problem
from fedgo_flwr.train import OPTIMIZERS
from fedgo_flwr.weighting import WEIGHTINGS


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
CLIENT_METHODS = [name for name, spec in STRATEGIES.items() if spec.clients]  # client-method's


@dataclass(frozen=True)
class RunKeys:
    """What runs: the method, the dataset, the model, the seed and where results go."""
    strategy: str = key("fedgo", "the method; see the strategies table in the README",
                        OneOf(STRATEGIES))
    client_method: str = key("", "the clients' method under the strategy's server, with its own "
                             "keys (docs/library.md); \"\" = the strategy's own clients",
                             Allowed(f"\"\" or one of {', '.join(CLIENT_METHODS)}",
                                     lambda v: v in ("", *CLIENT_METHODS)))
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
    tensorboard_dir: str = key("", "TensorBoard event files of the run in <this>/<run name> "
                               "(the tensorboard extra); \"\" = off")
    mlflow_uri: str = key("", "MLflow tracking URI of the run (http://..., sqlite:///mlflow.db; "
                          "the mlflow extra); \"\" = off")
    mlflow_experiment: str = key("fedgo-flwr", "its MLflow experiment (a bench plan's: the plan)")


@dataclass(frozen=True)
class DataKeys:
    """How the clients' data is split and drawn."""
    partitioner: str = key("dirichlet", "how the client pool is divided among the clients "
                           "(flwr-datasets' partitioners): dirichlet (label skew, the paper), "
                           "iid, pathological (classes-per-client classes each), shard "
                           "(shards-per-client label-sorted shards each), linear, square, "
                           "exponential (IID labels, sizes growing with the partition id)",
                           OneOf(PARTITIONERS), ("data",))
    alpha: float = key(0.1, "Dirichlet concentration of the client split (partitioner = "
                       "dirichlet)", POSITIVE, ("data",))
    dirichlet_group: int = key(0, "with partitioner = dirichlet: split the clients in groups "
                               "of this many, each drawing its share of the pool by "
                               "Dirichlet(alpha), as Lin et al. and FedGO's paper do for 100 "
                               "clients (10); 0 = one draw over all clients",
                               NON_NEGATIVE, ("data",))
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


@dataclass(frozen=True)
class RoundKeys:
    """The main FL rounds (Algorithm 2) and their aggregation."""
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


@dataclass(frozen=True)
class NodeKeys:
    """Nodes, checkpoints and resume."""
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


@dataclass(frozen=True)
class DistillationKeys:
    """The server update every ensemble-distillation strategy shares."""
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
    teachers_per_image: int = key(0, "FedGO: only this many teachers of largest odds weight "
                                  "label an image, the rest weighted 0 (a round's teacher "
                                  "forwards stop growing with the clients); 0 = all, the paper; "
                                  "not in the paper", NON_NEGATIVE, ("weighting",))
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
        "none", "none (the papers), clients: after distilling, as many clients as trained (or "
        "guard-judges), drawn from those that did not train this round, score the averaged and "
        "the distilled model on their own data, and the server keeps the distilled one only if "
        "its n_k-weighted accuracy is higher (one more exchange a round; the server reads no "
        "label), or labelled-val: the server scores both on its val-size LABELLED images instead"
        " (the data FedDF as published validates on); not in the papers", OneOf(GUARDS),
        ("distillation",))
    guard_judges: int = key(0, "distillation-guard = clients: how many judge (the first of the "
                            "same draw; 0 = as many as trained); fewer: a cheaper exchange, a "
                            "noisier score; not in the papers", NON_NEGATIVE, ("distillation",))
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


@dataclass(frozen=True)
class PreFLKeys:
    """FedGO's pre-FL stage (generator G1 and discriminators, Algorithm 3) and where the server
    computes."""
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
    server_sample_size: int = key(3000, "images of U sent to each client with discriminator-"
                                  "negatives = server-sample", AT_LEAST_ONE, ("pre-fl",))
    discriminator_calibration: str = key(
        "none", "none (the paper) or platt: each client holds out calibration-fraction of its "
        "images, fits log Phi_k = a * logit + b (a > 0) on them and sends (a, b); the odds "
        "lose the paper's cap e (not in the paper)", OneOf(CALIBRATIONS), ("pre-fl",))
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
