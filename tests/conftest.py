import gzip
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
REPO = Path(__file__).resolve().parents[1]


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """An IDX file as the MNIST family ships them (big-endian dims, unsigned bytes)."""
    magic = 0x0800 + array.ndim
    payload = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(payload)


def tiny_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n 28x28 images of 10 classes, each class a bright bar at its own place plus noise."""
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 60, size=(n, 28, 28))
    for i, c in enumerate(labels):
        images[i, 2 * c + 3: 2 * c + 7, 4:24] = 230
    return images.astype(np.uint8), labels.astype(np.uint8)


def write_tiny_fmnist(folder: Path, n_train: int = 1000, n_test: int = 200,
                      compress: bool = False) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        x, y = tiny_images(n, rng)
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", x, compress)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", y, compress)
    return folder


def wait_on_progress(done, log: Path, what: str, stall: float = 300.0,
                     poll: float = 0.5) -> None:
    """Wait until done() holds, as long as the run writing `log` makes progress: fail only when
    the log has not grown for `stall` seconds, so a busy machine's slow run is waited for
    and a stuck one is not."""
    size, last = -1, time.monotonic()
    while not done():
        now_size = log.stat().st_size if log.exists() else 0
        if now_size != size:
            size, last = now_size, time.monotonic()
        elif time.monotonic() - last > stall:
            raise TimeoutError(f"{what}: {log} did not grow for {stall:.0f}s")
        time.sleep(poll)


@pytest.fixture(scope="session", autouse=True)
def ray_temp_dir():
    """Ray's session folders (logs, sockets, spilled objects) of the real runs' simulations in a
    folder of this session's own, removed at its end: under /tmp/ray they would stay after
    every run. Short, for Ray's socket paths; the runs' processes inherit it."""
    path = tempfile.mkdtemp(prefix="fedgo-ray-")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = path
    yield path
    if before is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A data-dir holding a 1000/200-image Fashion-MNIST in torchvision's layout."""
    root = tmp_path_factory.mktemp("data")
    write_tiny_fmnist(root / "FashionMNIST" / "raw")
    return root


@pytest.fixture
def tiny_config(tiny_data_dir, tmp_path):
    """A FedGO config small enough for a second or two per run: FedAvg's 2NN (a sixtieth of its
    CNN's work an image) unless a test names the model it is about."""
    from fedgo_app.config import Config
    return Config().replace(
        data_dir=str(tiny_data_dir), results_dir=str(tmp_path / "results"), run_name="tiny",
        num_server_rounds=2, fraction_train=0.5, local_epochs=1, server_epochs=1,
        generator_steps=2, discriminator_epochs=1, distill_size=0, test_size=0,
        generator_width=8, discriminator_width=8, alpha=0.5, model="mlp")


# The test models are tiny: a second intra-op thread buys nothing, and on a busy machine
# OpenMP threads waiting for each other made the suite three times slower.
import torch  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------------------- test tiers
# unit: functions and modules; app: whole apps in process (the in-process grid, no Ray); e2e:
# real `flwr run`s, SuperLinks and SuperNodes as processes. `pytest -m "not e2e"` is the quick
# loop. A test module says its tier with `pytestmark`, or is listed here.
TIERS = {
    "unit": {"test_config", "test_data", "test_distill", "test_generator_cache", "test_models",
             "test_weighting", "test_toy", "test_results", "test_bench", "test_packaging",
             "test_teachers", "test_gan", "test_generators"},
    "app": {"test_server", "test_strategies", "test_feddf", "test_resilience",
            "test_client_app", "test_diagnostics", "test_sites",
            "test_data_free"},
    "e2e": {"test_flwr_run", "test_deploy"},
}


def pytest_collection_modifyitems(config, items):
    """Each test's tier, and an order that keeps the workers of `-n N --dist worksteal` busy
    to the end (see spread)."""
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        module = item.module.__name__.rsplit(".", 1)[-1]
        tier = next((t for t, modules in TIERS.items() if module in modules), None)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: no test tier; set pytestmark = "
                                    f"pytest.mark.<{'|'.join(TIERS)}> in its module")
        item.add_marker(tier)
    items[:] = spread(items, getattr(config, "workerinput", {}).get("workercount", 1))


def expected_seconds(item) -> float:
    """An e2e test's rough length on the quiet 2-core machine, its marker's `seconds` (a
    minute if it gives none); 0 for the in-process tiers."""
    mark = item.get_closest_marker("e2e")
    return 0.0 if mark is None else mark.kwargs.get("seconds", 60)


def spread(items: list, workers: int) -> list:
    """The e2e tests (minutes each, mostly waiting on processes) spread over the workers, each
    started at once, the rest of the time filled with in-process tests. pytest-xdist's
    worksteal first hands worker k a contiguous share of the order (len(left) // (workers - k)
    tests), and a worker that runs dry steals from the end of the longest queue: so each share
    starts with its e2e tests, the longest placed on the share with the least so far, and ends
    with in-process tests, which are what gets stolen. Every worker collects this same order."""
    real = sorted((i for i in items if expected_seconds(i)), key=expected_seconds, reverse=True)
    quick = [i for i in items if not expected_seconds(i)]
    shares, load = [[] for _ in range(workers)], [0.0] * workers
    for item in real:
        k = load.index(min(load))
        shares[k].append(item)
        load[k] += expected_seconds(item)
    left = len(items)
    for k, share in enumerate(shares):
        size = left // (workers - k)
        left -= size
        take = len(quick) if k == workers - 1 else max(0, size - len(share))
        share.extend(quick[:take])
        del quick[:take]
    return [item for share in shares for item in share]
