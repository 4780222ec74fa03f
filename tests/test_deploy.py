"""A real deployment on loopback: a SuperLink and 4 SuperNodes as separate processes, TLS with
certificates made by fedgo_lab.deploy, SuperNode authentication with registered keys, each
site on its own image folder; the FedGO app through `flwr run`, losing SuperNodes before
and during the run; every process stopped by PID afterwards. One deployment serves it all: a
SuperNode runs each message in a ClientApp process of its own, so a run here costs minutes."""

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from conftest import REPO, wait_on_progress
from fedgo_lab import deploy


def _free_port_block(size: int) -> int:
    """A port p such that p .. p + size - 1 were all free a moment ago."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + size > 65535:
            continue
        try:
            socks = [socket.socket() for _ in range(size)]
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports")


@pytest.mark.unit
def test_certificates_chain_to_the_ca_and_name_the_host(tmp_path):
    paths = deploy.make_certificates(tmp_path, ["127.0.0.1", "localhost"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert oct(paths["key"].stat().st_mode)[-3:] == "600"


def _flwr(env, *args, timeout=600, **kwargs):
    return subprocess.run([str(Path(sys.executable).parent / "flwr"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


TINY = ("num-server-rounds={rounds} local-epochs=1 server-epochs=1 generator-steps=2 "
        "generator-width=8 discriminator-width=8 discriminator-epochs=1 distill-size=0")


def _stranger_is_refused(info, folder: Path, registered: int, tmp_path, port: int) -> None:
    """A SuperNode with a key the SuperLink never registered gives up, never listed."""
    stranger_key, _ = deploy.make_node_keys(tmp_path / "stranger", 1)[0]
    certs = folder / "certificates"
    pid = deploy._spawn(
        [str(Path(sys.executable).parent / "flower-supernode"), "--root-certificates",
         str(certs / "ca.crt"), "--superlink", info["address"], "--port", str(port),
         "--max-retries", "2", "--node-config", "partition-id=0 num-partitions=1",
         "--auth-supernode-private-key", str(stranger_key)], tmp_path / "stranger.log",
        info["env"])
    try:
        deploy._wait_for(lambda: not deploy._alive(pid), 90, "the stranger kept trying")
    finally:
        if deploy._alive(pid):
            os.killpg(pid, 9)
    assert deploy._connected_nodes(info["env"]) == registered  # only the registered nodes


@pytest.mark.e2e(seconds=260)
def test_a_tls_deployment_of_sites_runs_fedgo_on_without_lost_supernodes(tmp_path):
    """One deployment, what a real one meets: TLS with certificates made by fedgo_lab.deploy,
    SuperNode authentication with registered keys (a stranger's key is refused), each of 4
    SuperNodes on its own ImageFolder (different class mixes; the fourth's classes differ
    from the server's, so it is left out, named in the log and the record). FedGO runs on it
    through `flwr run` after SuperNode 2 is stopped, and SuperNode 1 is stopped once round 1
    is checkpointed: the run completes with site 0 (and 1 until it went), and the record names
    both. The waits are not what ends a round: a stopped SuperNode's messages come back as
    the SuperLink's "Node Unavailable" errors (at once, or after its missed heartbeats), so
    the round timeout is long enough that a busy machine's slow replies still come within
    it; only the discovery waits its whole join-timeout, for the site that never comes."""
    from test_sites import CLASSES, write_site
    server = tmp_path / "server"
    write_site(server / "train", dict.fromkeys(CLASSES, 8), seed=0)
    write_site(server / "test", dict.fromkeys(CLASSES, 4), seed=1)
    mixes = [{"cat": 12, "dog": 2, "owl": 0}, {"cat": 0, "dog": 10, "owl": 3},
             {"cat": 3, "dog": 3, "owl": 9}, {"cat": 5, "dog": 5, "fox": 5}]
    sites = [tmp_path / f"site{i}" for i in range(4)]
    for i, (site, mix) in enumerate(zip(sites, mixes)):
        write_site(site, mix, seed=10 + i)
    folder = tmp_path / "deployment"
    port = _free_port_block(6)
    info = deploy.up(folder, nodes=4, port=port, secure=True, auth=True, node_data=sites)
    env, supernodes = info["env"], info["pids"]["supernodes"]
    results = tmp_path / "results"
    try:
        nodes = json.loads(_flwr(env, "supernode", "list", deploy.FEDERATION, "--format",
                                 "json", timeout=60).stdout)["nodes"]
        assert len(nodes) == 4 and all(n["status"] == "online" for n in nodes)
        _stranger_is_refused(info, folder, 4, tmp_path, port + 5)

        os.killpg(supernodes[2], signal.SIGTERM)
        deploy._wait_for(lambda: not deploy._alive(supernodes[2]), 30,
                         "SuperNode 2 did not stop")
        overrides = (f'dataset="folder" data-dir="{server}" results-dir="{results}" '
                     'run-name="sites" fraction-train=1.0 join-timeout=60 round-timeout=300 '
                     f"checkpoint-keep=3 {TINY.format(rounds=3)}")
        # the waits follow the run's log: a busy machine's slow run is waited for
        with open(tmp_path / "run.log", "w") as log:
            app = subprocess.Popen([str(Path(sys.executable).parent / "flwr"), "run",
                                    str(REPO), deploy.FEDERATION, "--stream", "-c", overrides],
                                   env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_on_progress(
                    lambda: (results / "sites" / "checkpoints" / "round-0001.pt").exists()
                    or app.poll() is not None, tmp_path / "run.log", "round 1 did not end")
                os.killpg(supernodes[1], signal.SIGTERM)
                wait_on_progress(lambda: app.poll() is not None, tmp_path / "run.log",
                                 "the run did not end")
            finally:
                if app.poll() is None:
                    app.kill()
    finally:
        pids = deploy.down(folder)
    assert len(pids) == 5 and not any(deploy._alive(pid) for pid in pids)
    out = (tmp_path / "run.log").read_text()
    record = json.loads((results / "sites" / "record.json").read_text())
    clients = record["clients"]
    assert clients["num_examples"] == {"0": 14, "1": 13}, out[-3000:]  # each site's own n_k
    assert clients["refused"] == {
        "3": "its classes [cat, dog, fox] are not the server's [cat, dog, owl]"}
    assert "is left out: its classes [cat, dog, fox] are not the server's" in out
    assert clients["missing_at_start"] == [2]
    assert "partitions [2] of 4 did not answer within 60s" in out
    assert record["bytes"]["pre_fl_down"] > 0  # G went to each site over TLS
    # both live sites' discriminators: in the stage's wait, or joined when they came
    pre_fl = record["pre_fl"]
    assert pre_fl["replies"]["usable"] + len(pre_fl.get("joined_late", [])) == 2, out[-3000:]
    rounds = record["rounds"][1:]
    assert rounds[0]["clients"] == [0, 1] and rounds[0]["replies"]["usable"] == 2
    lost = next(i for i, r in enumerate(rounds)
                if 1 in r["replies"]["missing"] or "1" in r["replies"]["failed"])
    assert all(r["clients"] == [0] and r["replies"]["absent"] == [1] for r in rounds[lost + 1:])
    assert lost + 1 < len(rounds)  # at least one round ran without it
    assert all(r["replies"]["usable"] >= 1 for r in rounds)
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2, 3]
