import statistics

import torch

from fedgo_lab.toy import RULES, make_data, oracle, run_toy


def test_toy_data_is_the_appendix_split():
    data = make_data(torch.Generator().manual_seed(0))
    pooled = data.pooled
    assert len(pooled) == 1200 and len(torch.unique(pooled, dim=0)) == 1200  # each point once
    means = torch.tensor([[4.0, 4.0], [-4.0, 4.0], [-4.0, -4.0], [4.0, -4.0]])
    for k, own in enumerate([2, 3, 1, 0]):  # clients 1-4 hold quadrants 3, 4, 2, 1
        x, _ = data.clients[k]
        nearest = torch.cdist(x, means).argmin(1)  # the Gaussian a point most likely came from
        assert len(x) == 300 and (nearest == own).sum() > 240
    assert data.server.shape == (300, 2) and data.server.abs().max() <= 12
    assert oracle(torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0]])).tolist() == [0, 0, 1, 2]


def test_fedgo_agrees_with_the_oracle_at_least_as_well_as_every_rule():
    torch.set_num_threads(1)
    results = [run_toy(seed, "converged") for seed in (0, 1, 2)]
    for where in ("grid", "test"):
        mean = {name: statistics.mean(r["agreement"][name][where] for r in results)
                for name in ("average", *RULES)}
        for name, value in mean.items():
            assert mean["odds"] >= value, (where, name, mean)
