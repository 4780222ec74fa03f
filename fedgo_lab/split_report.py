"""The clients' split, reported and drawn as FedGO's paper draws its own (App. E.2, Figures 5-6:
each client's images per class): client sizes, the classes a client holds, one panel an alpha.

    python -m fedgo_lab.split_report [--clients 100] [--alphas 0.1 0.05] [--out FIG.png]
                                     [--config KEY=VALUE ...]

The split is the run's (`dataset`, `seed`, `partitioner`, `dirichlet-group`, ...: the
run-config keys over the app's defaults); `--clients` is the federation's size.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from fedgo_app.data import client_indices, dataset
from fedgo_lab.cli import add_config_flag, config_from


def counts(cfg, clients: int) -> np.ndarray:
    """Images of each class a client holds, [K, classes]."""
    y = dataset(cfg).train_y.numpy()
    classes = int(y.max()) + 1
    return np.stack([np.bincount(y[client_indices(cfg, k, clients)], minlength=classes)
                     for k in range(clients)])


def summary(table: np.ndarray) -> str:
    sizes = table.sum(1)
    main = (table >= 0.1 * sizes[:, None]).sum(1)
    return (f"images a client: min {sizes.min()}, median {int(np.median(sizes))}, max "
            f"{sizes.max()}; classes holding >= 10% of a client's images: median "
            f"{np.median(main):g}, max {main.max()}; classes present: median "
            f"{np.median((table > 0).sum(1)):g}")


def draw(tables: dict[float, np.ndarray], out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(tables), 1, figsize=(12, 2.6 * len(tables)), squeeze=False)
    for ax, (alpha, table) in zip(axes[:, 0], tables.items()):
        k, c = np.nonzero(table)
        ax.scatter(k, c, s=table[k, c] * 60 / table.max(), color="tab:red", alpha=0.7)
        ax.set(title=f"alpha = {alpha}", xlabel="client", ylabel="class",
               yticks=range(table.shape[1]), xlim=(-1, len(table)))
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.split_report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.05])
    parser.add_argument("--out", type=Path, help="the figure (PNG); none: the summary only")
    add_config_flag(parser)
    args = parser.parse_args(argv)
    cfg = config_from(parser, args.config)
    tables = {}
    for alpha in args.alphas:
        tables[alpha] = counts(dataclasses.replace(cfg, alpha=alpha), args.clients)
        print(f"alpha {alpha}, {args.clients} clients: {summary(tables[alpha])}", flush=True)
    if args.out:
        draw(tables, args.out, f"{cfg.dataset}: images of each class a client holds "
             f"({args.clients} clients, dirichlet-group {cfg.dirichlet_group}, seed {cfg.seed})")
        print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
