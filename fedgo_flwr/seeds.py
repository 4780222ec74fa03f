"""The seeds a run derives from its one `seed`: per round, and per client within a stage."""


def round_seed(seed: int, server_round: int) -> int:
    """The seed of one round's client training and distillation batches."""
    return seed * 1_000 + server_round


def client_seed(stage_seed: int, partition_id: int) -> int:
    """The server's seed for a stage or round, made distinct per client."""
    return stage_seed * 1_000 + partition_id
