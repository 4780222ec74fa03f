"""A real deployment on loopback: a SuperLink and 3 SuperNodes as separate processes, TLS with
certificates made by fedgo_lab.deploy, SuperNode authentication with registered keys; the
FedGO app for 2 rounds through `flwr run`; every process stopped by PID afterwards."""

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from conftest import REPO
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


def test_certificates_chain_to_the_ca_and_name_the_host(tmp_path):
    paths = deploy.make_certificates(tmp_path, ["127.0.0.1", "localhost"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert oct(paths["key"].stat().st_mode)[-3:] == "600"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A SuperLink with TLS and SuperNode authentication, and 3 registered SuperNodes, shared
    by the tests below in file order (the second stops two of the nodes)."""
    folder = tmp_path_factory.mktemp("deployment")
    info = deploy.up(folder, nodes=3, port=_free_port_block(4), secure=True, auth=True)
    yield info
    pids = deploy.down(folder)
    assert len(pids) == 4 and not any(deploy._alive(pid) for pid in pids)


def _flwr(env, *args, timeout=600, **kwargs):
    return subprocess.run([str(Path(sys.executable).parent / "flwr"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def _run_app(env, cwd, overrides, **kwargs):
    """`flwr run` on the deployment, to its end; returns its output and final status."""
    out = _flwr(env, "run", str(REPO), deploy.FEDERATION, "--stream", "-c", overrides, cwd=cwd,
                **kwargs)
    out = out.stdout + out.stderr
    run_id = re.search(r"Successfully started run (\d+)", out)
    assert run_id, out[-3000:]
    listing = _flwr(env, "list", deploy.FEDERATION, "--run-id", run_id.group(1), "--format",
                    "json", timeout=120)
    return out, json.loads(listing.stdout)["runs"][0]["status"]


TINY = ("num-server-rounds={rounds} local-epochs=1 server-epochs=1 generator-steps=2 "
        "generator-width=8 discriminator-width=8 discriminator-epochs=1 distill-size=0 alpha=0.5")


def test_fedgo_runs_on_a_tls_deployment_with_authenticated_supernodes(deployment, tiny_data_dir,
                                                                      tmp_path):
    env = deployment["env"]
    nodes = json.loads(_flwr(env, "supernode", "list", deploy.FEDERATION, "--format", "json",
                             timeout=60).stdout)["nodes"]
    assert len(nodes) == 3 and all(n["status"] == "online" for n in nodes)
    results = tmp_path / "results"
    out, status = _run_app(env, tmp_path, f'data-dir="{tiny_data_dir}" results-dir="{results}" '
                           f'run-name="deployed" fraction-train=0.67 {TINY.format(rounds=2)}')
    assert status == "finished:completed", out[-3000:]
    record = json.loads((results / "deployed" / "record.json").read_text())
    assert record["clients"]["num_partitions"] == 3  # partition ids from --node-config
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert record["bytes"]["pre_fl_down"] > 0  # G went to each node over TLS


def test_a_run_goes_on_without_supernodes_lost_before_and_during_it(deployment, tiny_data_dir,
                                                                    tmp_path):
    """SuperNode 2 stopped before the run, SuperNode 1 once round 1 is checkpointed: the run
    completes with partition 0 (and 1 until it went), and the record names both. The waits
    are not what ends a round here: a stopped SuperNode's messages come back as the
    SuperLink's "Node Unavailable" errors (at once, or after its missed heartbeats), so the
    round timeout is long enough that a busy machine's slow replies still come within it;
    only the discovery waits its whole join-timeout, for the partition that never comes."""
    env, supernodes = deployment["env"], deployment["pids"]["supernodes"]
    os.killpg(supernodes[2], signal.SIGTERM)
    deploy._wait_for(lambda: not deploy._alive(supernodes[2]), 30, "SuperNode 2 did not stop")
    results = tmp_path / "results"
    overrides = (f'data-dir="{tiny_data_dir}" results-dir="{results}" run-name="lost" '
                 f"fraction-train=1.0 join-timeout=60 round-timeout=300 checkpoint-keep=3 "
                 f"{TINY.format(rounds=3)}")
    log = open(tmp_path / "run.log", "w")
    app = subprocess.Popen([str(Path(sys.executable).parent / "flwr"), "run", str(REPO),
                            deploy.FEDERATION, "--stream", "-c", overrides], env=env,
                           cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deploy._wait_for(lambda: (results / "lost" / "checkpoints" / "round-0001.pt").exists()
                         or app.poll() is not None, 300, "round 1 did not end")
        os.killpg(supernodes[1], signal.SIGTERM)
        app.wait(timeout=400)
    finally:
        if app.poll() is None:
            app.kill()
    out = (tmp_path / "run.log").read_text()
    record = json.loads((results / "lost" / "record.json").read_text())
    assert record["clients"]["missing_at_start"] == [2], out[-3000:]
    # both live SuperNodes' discriminators: in the stage's wait, or joined when they came
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
    assert "partitions [2] of 3 did not answer within 60s" in out


def test_an_unregistered_supernode_is_refused(tmp_path):
    folder = tmp_path / "deployment"
    info = deploy.up(folder, nodes=1, port=_free_port_block(3), secure=True, auth=True)
    try:
        stranger_key, _ = deploy.make_node_keys(tmp_path / "stranger", 1)[0]
        certs = folder / "certificates"
        log = tmp_path / "stranger.log"
        pid = deploy._spawn(
            [str(Path(sys.executable).parent / "flower-supernode"), "--root-certificates",
             str(certs / "ca.crt"), "--superlink", info["address"], "--port",
             str(int(info["address"].split(":")[1]) + 2), "--max-retries", "2",
             "--node-config", "partition-id=0 num-partitions=1",
             "--auth-supernode-private-key", str(stranger_key)], log, info["env"])
        try:
            deploy._wait_for(lambda: not deploy._alive(pid), 90, "the stranger kept trying")
        finally:
            if deploy._alive(pid):
                os.killpg(pid, 9)
        assert deploy._connected_nodes(info["env"]) == 1  # only the registered node
    finally:
        deploy.down(folder)


def test_sites_with_their_own_folders_run_fedgo_and_a_foreign_site_is_refused(tmp_path):
    """Each of 3 SuperNodes trains on its own ImageFolder (different class mixes), the server
    on its own U and test split; a fourth node whose classes differ is left out, named in the
    log and the record."""
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
    info = deploy.up(folder, nodes=4, port=_free_port_block(5), secure=False, auth=False,
                     node_data=sites)
    try:
        results = tmp_path / "results"
        out, status = _run_app(
            info["env"], tmp_path,
            f'dataset="folder" data-dir="{server}" results-dir="{results}" run-name="sites" '
            f'fraction-train=1.0 join-timeout=60 {TINY.format(rounds=2)}')
    finally:
        deploy.down(folder)
    assert status == "finished:completed", out[-3000:]
    record = json.loads((results / "sites" / "record.json").read_text())
    assert record["clients"]["num_examples"] == {"0": 14, "1": 13, "2": 15}
    assert record["clients"]["refused"] == {
        "3": "its classes [cat, dog, fox] are not the server's [cat, dog, owl]"}
    assert [r["clients"] for r in record["rounds"][1:]] == [[0, 1, 2], [0, 1, 2]]
    assert "is left out: its classes [cat, dog, fox] are not the server's" in out
