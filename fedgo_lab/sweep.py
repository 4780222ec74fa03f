"""Budget sweep, round 1 only (in the spirit of the paper's Tables 12 and 13): the ensemble
test accuracy of every weighting rule against generator steps and discriminator epochs, at
several numbers of local epochs, and for the discriminator options beyond the paper
(calibrated, trained against a sample of U), all on the SAME client models.

    python -m fedgo_lab.sweep [--alphas 0.1 0.05] [--seed 0] [--clients 20]
        [--generator-steps 0 100 300 1000] [--discriminator-epochs 2 5 10]
        [--local-epochs 1 5] [--discriminators paper calibrated server-sample ...]
        [--config KEY=VALUE ...] [--out results/sweep] [--repo DIR]

Round 1 is rebuilt exactly as a run makes it (same split, partitions, sampled clients, initial
model and client seeds), with the library's functions instead of messages. Generators are
trained once to the largest step count, snapshotting the smaller ones on the way (identical
to shorter trainings: the same seed and draws), and stored in the generator cache of
<results-dir>/generators, where runs with the same settings reuse them. Discriminators are
trained once per generator to the largest epoch count and snapshotted likewise. Writes
<out>/sweep.json and <out>/sweep.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from fedgo_app.config import Config
from fedgo_app.data import client_data, dataset, server_data
from fedgo_flwr.diagnostics import (CLASS_COUNT_FROM_AVERAGED, CLASS_COUNT_FROM_OWN, ORACLE,
                                    WITH_AVERAGED, ensemble_diagnostics)
from fedgo_flwr.calibration import calibrate_discriminator, hold_out
from fedgo_flwr.gan import (Negatives, generator_negatives, image_negatives, log_odds,
                            train_discriminator, train_wgan_gp)
from fedgo_app.generator_cache import generator_description, load_generator, save_generator
from fedgo_flwr.models import Critic, create_classifier
from fedgo_flwr.seeds import client_seed, round_seed
from fedgo_flwr.sampling import sample_clients
from fedgo_flwr.aggregation import mean
from fedgo_app.generators import new_generator
from fedgo_app.strategies.fedgo import new_local_discriminator
from fedgo_flwr.gan import server_sample
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.train import evaluate, resolve_device, train_classifier
from fedgo_flwr.weighting import odds_weights

# The discriminators a FedGO run can get: (discriminator-negatives, discriminator-calibration).
VARIANTS = {"paper": ("generator", "none"), "calibrated": ("generator", "platt"),
            "server-sample": ("server-sample", "none"),
            "server-sample-calibrated": ("server-sample", "platt")}
# generator_steps of the rows whose discriminators learnt against the sample of U.
NO_GENERATOR = -1
from fedgo_lab.cli import add_config_flag, add_out_flag, add_repo_flag, config_from, repo_of


def say(text: str) -> None:
    print(f"[sweep] {text}", flush=True)


def generators(cfg: Config, u: torch.Tensor, steps: list[int], device) -> dict[int, dict]:
    """Generator state per step count, from the cache or trained once to max(steps)."""
    image_shape = tuple(u.shape[1:])
    root = cfg.results_path / "generators"
    out: dict[int, dict] = {}
    for s in steps:
        torch.manual_seed(cfg.seed)  # as generators.train_on_u initialises G
        g = new_generator(cfg, image_shape)
        if s == 0 or load_generator(root, generator_description(
                cfg, u, device, generator_steps=s), g) is not None:
            out[s] = copy.deepcopy(g.state_dict())
    missing = sorted(set(steps) - set(out))
    if not missing:
        return out
    torch.manual_seed(cfg.seed)
    g = new_generator(cfg, image_shape)
    c, h, _ = image_shape
    critic = Critic(c, h, cfg.generator_width)
    start = time.perf_counter()

    def snapshot(step: int, w_dist: float, g_loss: float) -> None:
        if step in missing:
            out[step] = copy.deepcopy(g.state_dict())
            info = {"generator-steps": step, "wasserstein-estimate": w_dist,
                    "generator-loss": g_loss}
            save_generator(root, generator_description(cfg, u, device, generator_steps=step),
                           g, info)
            say(f"generator step {step}: Wasserstein estimate {w_dist:.3f} "
                f"({time.perf_counter() - start:.0f} s)")

    train_wgan_gp(g, critic, u, steps=max(missing), critic_steps=cfg.critic_steps,
                  gp_weight=cfg.gp_weight, lr=cfg.gan_lr, batch_size=cfg.gan_batch_size,
                  flip=cfg.flip, seed=cfg.seed, device=device, progress=snapshot)
    return out


def client_models(cfg: Config, pids: list[int], num_clients: int, epochs: int, device,
                  image_shape, num_classes) -> list[torch.nn.Module]:
    """Round 1's client models theta_k^1 after `epochs` local epochs, as the ClientApp makes
    them from the initial model theta^0."""
    torch.manual_seed(cfg.seed)  # theta^0, as the ServerApp makes it
    initial = create_classifier(cfg.model, image_shape[0], num_classes, image_shape[1])
    nets = []
    for pid in pids:
        x, y = client_data(cfg, pid, num_clients)
        net = copy.deepcopy(initial)
        train_classifier(net, x, y, epochs=epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                         flip=cfg.flip, crop=cfg.random_crop, optimizer=cfg.optimizer,
                         momentum=cfg.momentum,
                         seed=client_seed(round_seed(cfg.seed, 1), pid),
                         device=device)
        nets.append(net.cpu())
    return nets


def discriminator_odds(cfg: Config, negatives: Negatives, calibrated: bool, pids: list[int],
                       num_clients: int, epochs: list[int], test_x, device,
                       image_shape) -> dict[int, torch.Tensor]:
    """log Phi_k on the test split [K, N] after each number of discriminator epochs, each D_k
    trained (and calibrated) as the ClientApp does it."""
    per_epoch: dict[int, list[torch.Tensor]] = {e: [] for e in epochs}
    for pid in pids:
        x, _ = client_data(cfg, pid, num_clients)
        seed = client_seed(cfg.seed, pid)
        x, held_out = hold_out(x, cfg.calibration_fraction if calibrated else 0.0, seed)
        d = new_local_discriminator(seed, image_shape, cfg.discriminator_width)

        def snapshot(epoch: int) -> None:
            if epoch in per_epoch:
                cal = calibrate_discriminator(d, negatives, held_out, seed=seed + 1,
                                              device=device) if calibrated else None
                per_epoch[epoch].append(log_odds(d, test_x, device=device, calibration=cal))
                d.train()

        train_discriminator(d, negatives, x, epochs=max(epochs), lr=cfg.discriminator_lr,
                            batch_size=cfg.gan_batch_size, flip=cfg.flip, seed=seed,
                            device=device, after_epoch=snapshot)
    return {e: torch.stack(v) for e, v in per_epoch.items()}


def negatives_of(cfg: Config, variant: str, gens: dict[int, dict], u, image_shape
                 ) -> dict[int, Negatives]:
    """The negatives of a variant, by generator steps (NO_GENERATOR: the sample of U)."""
    if VARIANTS[variant][0] == "server-sample":
        return {NO_GENERATOR: image_negatives(server_sample(u, cfg.server_sample_size, cfg.seed),
                                              flip=cfg.flip)}
    out = {}
    for steps, state in gens.items():
        g = new_generator(cfg, image_shape)
        g.load_state_dict(state)
        out[steps] = generator_negatives(g)
    return out


def sweep(cfg: Config, alphas, num_clients, generator_steps, discriminator_epochs,
          local_epochs, variants=("paper",)) -> list[dict]:
    device = resolve_device(cfg.server_device)
    data = dataset(cfg)
    u, test_x, test_y = server_data(cfg)
    image_shape = tuple(u.shape[1:])
    start = time.perf_counter()
    needs_g = any(VARIANTS[v][0] == "generator" for v in variants)
    gens = generators(cfg, u, sorted(set(generator_steps)), device) if needs_g else {}
    say(f"generators ready ({time.perf_counter() - start:.0f} s)")
    pids = sample_clients(list(range(num_clients)), cfg.fraction_train, cfg.seed, 1)
    rows = []
    for alpha in alphas:
        acfg = cfg.replace(alpha=alpha)
        hist = torch.stack([torch.bincount(client_data(acfg, p, num_clients)[1],
                                           minlength=data.num_classes) for p in pids])
        n_k = hist.sum(1).float()
        say(f"alpha {alpha:g}: round-1 clients {pids}, n_k {n_k.long().tolist()}")
        logits, fedavg, averaged = {}, {}, {}
        for e in sorted(set(local_epochs)):
            t = time.perf_counter()
            nets = client_models(acfg, pids, num_clients, e, device, image_shape,
                                 data.num_classes)
            # As the run scores them: teacher_logits, bf16 on a GPU (server-amp).
            logits[e] = teacher_logits(nets, test_x, device=device, amp=cfg.server_amp)
            states = [net.state_dict() for net in nets]
            avg = create_classifier(cfg.model, image_shape[0], data.num_classes, image_shape[1])
            avg.load_state_dict(mean(states, [int(n) for n in n_k], states[0]))
            fedavg[e] = evaluate(avg, test_x, test_y, device=device)[0]
            averaged[e] = teacher_logits([avg], test_x, device=device, amp=cfg.server_amp)[0]
            say(f"alpha {alpha:g}: {e} local epoch(s) trained, FedAvg {100 * fedavg[e]:.1f} % "
                f"({time.perf_counter() - t:.0f} s)")
        for variant, steps, negatives in [(v, s, n) for v in variants for s, n in
                                          negatives_of(acfg, v, gens, u, image_shape).items()]:
            calibrated = VARIANTS[variant][1] != "none"
            t = time.perf_counter()
            odds = discriminator_odds(acfg, negatives, calibrated, pids, num_clients,
                                      sorted(set(discriminator_epochs)), test_x, device,
                                      image_shape)
            against = "the sample of U" if steps == NO_GENERATOR else f"G({steps} steps)"
            say(f"alpha {alpha:g}: {variant} discriminators against {against} trained "
                f"({time.perf_counter() - t:.0f} s)")
            for d_epochs, log_phi in odds.items():
                for e in sorted(logits):
                    diag = ensemble_diagnostics(logits[e], log_phi, n_k, test_y,
                                                active=odds_weights(logits[e], log_phi, n_k),
                                                histograms=hist, averaged_logits=averaged[e],
                                                capped=not calibrated)
                    rows.append({"alpha": alpha, "local_epochs": e, "discriminators": variant,
                                 "generator_steps": steps, "discriminator_epochs": d_epochs,
                                 "fedavg_acc": fedavg[e], "clients": pids, **diag})
    return rows


# Columns of the markdown table: (header, space, rule); a rule a row lacks shows "-".
TABLE = (("uniform", "logits", "uniform"), ("odds", "logits", "odds"),
         ("odds β=4", "logits", "odds-beta4"), ("odds unsquashed", "logits", "odds-unsquashed"),
         ("domain-aware", "logits", "domain-aware"), ("uniform (prob.)", "probabilities", "uniform"),
         ("odds (prob.)", "probabilities", "odds"),
         ("odds β=4 (prob.)", "probabilities", "odds-beta4"),
         ("class-count", "logits", "class-count"),
         ("class-count from averaged", "logits", CLASS_COUNT_FROM_AVERAGED),
         ("class-count from odds", "logits", CLASS_COUNT_FROM_OWN),
         ("odds + averaged", "logits", WITH_AVERAGED), ("label oracle", "logits", ORACLE))
# The rules whose weight on the oracle's client is shown.
WEIGHT_ON_ORACLE = ("uniform", "odds", "odds-beta4", "class-count")


def markdown(rows: list[dict]) -> str:
    head = ["alpha", "local ep.", "D", "G steps", "D ep.", "FedAvg"] + [h for h, _, _ in TABLE] + [
        "w(oracle client): " + " / ".join(WEIGHT_ON_ORACLE), "Phi mean", "Phi near e"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (-r["alpha"], r["local_epochs"],
                                         r.get("discriminators", "paper"), r["generator_steps"],
                                         r["discriminator_epochs"])):
        w = r["weight_on_oracle_client"]
        steps = r["generator_steps"]
        cells = [f"{r['alpha']:g}", str(r["local_epochs"]), r.get("discriminators", "paper"),
                 "-" if steps == NO_GENERATOR else str(steps), str(r["discriminator_epochs"]),
                 f"{100 * r['fedavg_acc']:.1f}"]
        cells += [f"{100 * r[space][rule]['acc']:.1f}" if rule in r[space] else "-"
                  for _, space, rule in TABLE]
        cells += [" / ".join(f"{w[k]:.2f}" if k in w else "-" for k in WEIGHT_ON_ORACLE),
                  f"{r['phi']['mean']:.3g}",
                  "-" if VARIANTS[r.get("discriminators", "paper")][1] != "none"  # no cap
                  else f"{100 * r['phi']['share_near_cap']:.0f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.05],
                        help="Dirichlet alphas")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--clients", type=int, default=20, help="K, the number of partitions")
    parser.add_argument("--generator-steps", type=int, nargs="+", default=[0, 100, 300, 1000],
                        help="generator step counts (0: an untrained generator)")
    parser.add_argument("--discriminator-epochs", type=int, nargs="+", default=[2, 5, 10],
                        help="discriminator epoch counts")
    parser.add_argument("--local-epochs", type=int, nargs="+", default=[1, 5],
                        help="local epoch counts of the round-1 client models")
    parser.add_argument("--discriminators", nargs="+", default=["paper"], choices=VARIANTS,
                        help="discriminator options: paper (against G), calibrated (Platt, "
                             "calibration-fraction held out), server-sample (against "
                             "server-sample-size images of U), server-sample-calibrated")
    add_config_flag(parser, "default: pyproject's, with the full test set and results-dir "
                            "results/ in the repository")
    add_out_flag(parser, "sweep.json and sweep.md go", "results/sweep")
    add_repo_flag(parser)
    args = parser.parse_args(argv)
    repo = repo_of(parser, args)
    if min(args.generator_steps) < 0 or min(args.discriminator_epochs) < 1 or min(
            args.local_epochs) < 1:
        parser.error("--generator-steps must be >= 0, --discriminator-epochs and "
                     "--local-epochs >= 1")
    cfg = config_from(parser, args.config,
                      under={"test-size": 0, "results-dir": str(repo / "results")},
                      over={"seed": args.seed})
    out = args.out or repo / "results" / "sweep"
    start = time.perf_counter()
    rows = sweep(cfg, args.alphas, args.clients, args.generator_steps,
                 args.discriminator_epochs, args.local_epochs, args.discriminators)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(
        {"config": cfg.to_run_config(), "clients": args.clients, "rows": rows,
         "seconds": time.perf_counter() - start}, indent=1))
    table = markdown(rows)
    (out / "sweep.md").write_text(table + "\n")
    print(f"\n{table}\n\n[sweep] {time.perf_counter() - start:.0f} s; {out}/sweep.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
