"""A real deployment on loopback: a SuperLink and 3 SuperNodes as separate processes, TLS with
certificates made by fedgo_flwr.deploy, SuperNode authentication with registered keys; the
FedGO app for 2 rounds through `flwr run`; every process stopped by PID afterwards."""

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from conftest import REPO
from fedgo_flwr import deploy


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


def test_fedgo_runs_on_a_tls_deployment_with_authenticated_supernodes(tiny_data_dir, tmp_path):
    folder = tmp_path / "deployment"
    bindir = Path(sys.executable).parent
    info = deploy.up(folder, nodes=3, port=_free_port_block(4), secure=True, auth=True)
    try:
        env = info["env"]
        nodes = json.loads(subprocess.run(
            [str(bindir / "flwr"), "supernode", "list", deploy.FEDERATION, "--format", "json"],
            env=env, capture_output=True, text=True, timeout=60).stdout)["nodes"]
        assert len(nodes) == 3 and all(n["status"] == "online" for n in nodes)
        results = tmp_path / "results"
        overrides = (f'data-dir="{tiny_data_dir}" results-dir="{results}" run-name="deployed" '
                     "num-server-rounds=2 fraction-train=0.67 local-epochs=1 server-epochs=1 "
                     "generator-steps=2 generator-width=8 discriminator-width=8 "
                     "discriminator-epochs=1 distill-size=0 alpha=0.5")
        run = subprocess.run([str(bindir / "flwr"), "run", str(REPO), deploy.FEDERATION,
                              "--stream", "-c", overrides],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        out = run.stdout + run.stderr
        run_id = re.search(r"Successfully started run (\d+)", out)
        assert run_id, out[-3000:]
        listing = subprocess.run([str(bindir / "flwr"), "list", deploy.FEDERATION, "--run-id",
                                  run_id.group(1), "--format", "json"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert json.loads(listing.stdout)["runs"][0]["status"] == "finished:completed", out[-3000:]
        record = json.loads((results / "deployed" / "record.json").read_text())
        assert record["clients"]["num_partitions"] == 3  # partition ids from --node-config
        assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
        assert record["bytes"]["pre_fl_down"] > 0  # G went to each node over TLS
    finally:
        pids = deploy.down(folder)
    assert len(pids) == 4 and not any(deploy._alive(pid) for pid in pids)


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
