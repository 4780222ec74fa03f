"""The toy example of FedGO's Figure 1 (Appendix E.1), with every weighting rule.

Four 2-D Gaussians (variance 3, means (+-4, +-4)), 300 points each, labelled red for (4, 4)
and (-4, -4), blue for (-4, 4), green for (4, -4). Client k holds 270 points of one quadrant's
Gaussian (clients 1-4: quadrants 3, 4, 2, 1) and 10 of each other one. The server holds 300
unlabeled points uniform on [-12, 12]^2, which are also the discriminators' fake samples.
Each client trains a 3-layer MLP classifier (Adam 1e-3, 2 epochs) and a 3-layer discriminator;
the server averages the classifiers and distills the average for 2 epochs on the clients'
pooled data, pseudo-labelled by each weighting rule. The oracle boundary is the two axes.

    python -m fedgo_lab.toy --preset converged --seeds 0 1 2 --out results/toy

Two discriminator presets: `literal` is the paper's text (RMSprop 5e-5, 1 epoch), under which
the discriminators barely move; `converged` trains them to convergence (Adam 1e-3, 50
epochs). Choices the paper leaves open: hidden width 64, a plain sigmoid discriminator (the
odds D/(1-D) are then exp(logit), exactly Theorem 3.6's ratio), a 240x240 grid on
[-12, 12]^2 and 4,000 fresh mixture points for measuring agreement with the oracle.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.distill import kl_to_targets, pseudo_labels
from fedgo_flwr.train import minibatch_descent
from fedgo_flwr.weighting import WEIGHTINGS

MEANS = torch.tensor([[4.0, 4.0], [-4.0, 4.0], [-4.0, -4.0], [4.0, -4.0]])  # quadrants 1-4
LABELS = torch.tensor([0, 1, 0, 2])  # red, blue, red, green
CLIENT_QUADRANT = [2, 3, 1, 0]  # clients 1-4 hold quadrants 3, 4, 2, 1 (0-based rows above)
RULES = ("uniform", "variance", "entropy", "domain-aware", "odds")
PRESETS = {
    "literal": {"optimizer": "rmsprop", "lr": 5e-5, "epochs": 1},
    "converged": {"optimizer": "adam", "lr": 1e-3, "epochs": 50},
}


def mlp(out: int, width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, out))


def oracle(x: torch.Tensor) -> torch.Tensor:
    """Red where x*y > 0, blue in the 2nd quadrant, green in the 4th."""
    red = (x[:, 0] * x[:, 1]) > 0
    return torch.where(red, 0, torch.where(x[:, 0] < 0, 1, 2))


def sample_mixture(per_gaussian: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cat([m + 3 ** 0.5 * torch.randn(per_gaussian, 2, generator=gen) for m in MEANS])
    return x, LABELS.repeat_interleave(per_gaussian)


@dataclass
class ToyData:
    clients: list[tuple[torch.Tensor, torch.Tensor]]
    server: torch.Tensor  # unlabeled, uniform on the square

    @property
    def pooled(self) -> torch.Tensor:
        return torch.cat([x for x, _ in self.clients])


def make_data(gen: torch.Generator) -> ToyData:
    x, y = sample_mixture(300, gen)
    parts: list[list[torch.Tensor]] = [[] for _ in range(4)]
    for g in range(4):  # deal each Gaussian's 300 points out once: 270 + 3 x 10
        order = torch.randperm(300, generator=gen) + 300 * g
        owner = CLIENT_QUADRANT.index(g)
        parts[owner].append(order[:270])
        for j, k in enumerate(k for k in range(4) if k != owner):
            parts[k].append(order[270 + 10 * j: 280 + 10 * j])
    clients = [(x[torch.cat(p)], y[torch.cat(p)]) for p in parts]
    server = torch.rand(300, 2, generator=gen) * 24 - 12
    return ToyData(clients, server)


def _fit(model: nn.Module, opt: torch.optim.Optimizer, n: int, epochs: int,
         gen: torch.Generator, batch_loss) -> float:
    model.train()
    return minibatch_descent(opt, n, epochs=epochs, batch_size=64, gen=gen, batch_loss=batch_loss)


def train_client(x: torch.Tensor, y: torch.Tensor, init: dict, gen: torch.Generator) -> nn.Module:
    model = mlp(3)
    model.load_state_dict(init)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _fit(model, opt, len(y), 2, gen, lambda idx: F.cross_entropy(model(x[idx]), y[idx]))
    return model.eval()


def train_discriminator(real: torch.Tensor, fake: torch.Tensor, preset: dict,
                        gen: torch.Generator) -> nn.Module:
    d = mlp(1)
    opt = (torch.optim.RMSprop if preset["optimizer"] == "rmsprop" else torch.optim.Adam)(
        d.parameters(), lr=preset["lr"])

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        f = fake[torch.randint(len(fake), (len(idx),), generator=gen)]
        return (F.binary_cross_entropy_with_logits(d(real[idx]).squeeze(1), torch.ones(len(idx)))
                + F.binary_cross_entropy_with_logits(d(f).squeeze(1), torch.zeros(len(idx))))

    _fit(d, opt, len(real), preset["epochs"], gen, batch_loss)
    return d.eval()


def run_toy(seed: int, preset: str = "converged") -> dict:
    """One seed: the averaged model and the model distilled with each rule, with their
    agreement with the oracle on a dense grid and on a fresh sample."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    data = make_data(gen)
    init = mlp(3).state_dict()
    classifiers = [train_client(x, y, init, gen) for x, y in data.clients]
    discriminators = [train_discriminator(x, data.server, PRESETS[preset], gen)
                      for x, _ in data.clients]
    n_k = torch.tensor([float(len(y)) for _, y in data.clients])
    averaged = {k: sum(c.state_dict()[k] * (n / n_k.sum()) for c, n in zip(classifiers, n_k))
                for k in init}

    u = data.pooled  # the distillation set: the clients' pooled data
    with torch.no_grad():
        logits = torch.stack([c(u) for c in classifiers])
        log_odds = torch.stack([d(u).squeeze(1) for d in discriminators])  # plain sigmoid D
    models = {"average": mlp(3)}
    models["average"].load_state_dict(averaged)
    for rule in RULES:
        targets = pseudo_labels(logits, WEIGHTINGS[rule](logits, log_odds, n_k))
        student = mlp(3)
        student.load_state_dict(averaged)
        opt = torch.optim.Adam(student.parameters(), lr=1e-3)
        _fit(student, opt, len(u), 2, gen, lambda idx: kl_to_targets(student(u[idx]), targets[idx]))
        models[rule] = student.eval()

    axis = torch.linspace(-12, 12, 240)
    grid = torch.cartesian_prod(axis, axis)
    test, _ = sample_mixture(1000, gen)
    result = {"seed": seed, "preset": preset, "models": models, "data": data, "agreement": {}}
    with torch.no_grad():
        for name, m in models.items():
            result["agreement"][name] = {
                "grid": (m(grid).argmax(1) == oracle(grid)).float().mean().item(),
                "test": (m(test).argmax(1) == oracle(test)).float().mean().item()}
    return result


def plot(result: dict, path: Path) -> None:
    """Decision regions like the paper's Figure 1, oracle boundaries in black."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = torch.tensor([[0.85, 0.15, 0.15], [0.15, 0.3, 0.85], [0.15, 0.7, 0.25]])
    axis = torch.linspace(-12, 12, 240)
    grid = torch.cartesian_prod(axis, axis)
    titles = {"average": "parameter average", "uniform": "uniform (FedDF)",
              "variance": "variance (Fed-ET)", "entropy": "entropy (FedHKT/DS)",
              "domain-aware": "domain-aware (DaFKD)", "odds": "odds (FedGO)"}
    fig, axes = plt.subplots(1, 6, figsize=(21, 3.8))
    for ax, (name, model) in zip(axes, result["models"].items()):
        with torch.no_grad():
            probs = torch.softmax(model(grid), 1)
        image = (probs @ colours).view(240, 240, 3).transpose(0, 1)
        ax.imshow(image.numpy(), origin="lower", extent=(-12, 12, -12, 12))
        for x, y in result["data"].clients:
            ax.scatter(x[:, 0], x[:, 1], c=colours[y].numpy(), s=3, edgecolors="white",
                       linewidths=0.2)
        ax.axhline(0, color="black", lw=1.2)
        ax.axvline(0, color="black", lw=1.2)
        agree = result["agreement"][name]
        ax.set_title(f"{titles[name]}\ngrid {agree['grid']:.3f} | test {agree['test']:.3f}",
                     fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"FedGO toy example (App. E.1), {result['preset']} discriminators, "
                 f"seed {result['seed']}: agreement with the oracle")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(results: list[dict]) -> str:
    lines = ["| model | grid agreement | test agreement |", "|---|---|---|"]
    for name in results[0]["agreement"]:
        cells = []
        for where in ("grid", "test"):
            v = [r["agreement"][name][where] for r in results]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{100 * statistics.mean(v):.2f} ± {100 * sd:.2f}")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.toy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="converged",
                        help="the discriminators' training: the paper's text (literal) or to "
                             "convergence")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run")
    parser.add_argument("--out", type=Path, default=Path("results/toy"),
                        help="where the figure of the first seed goes")
    args = parser.parse_args(argv)
    # The models are tiny: one thread is fastest, and spares a busy machine's other cores.
    torch.set_num_threads(1)
    results = []
    for seed in args.seeds:
        results.append(run_toy(seed, args.preset))
        print(f"seed {seed}: " + ", ".join(f"{k} {v['test']:.3f}"
                                           for k, v in results[-1]["agreement"].items()))
    figure = args.out / f"toy-{args.preset}.png"
    plot(results[0], figure)
    print(f"\nagreement with the oracle, {args.preset} discriminators, seeds {args.seeds} "
          f"(mean ± std, %):\n{summary(results)}\n\nfigure: {figure.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
