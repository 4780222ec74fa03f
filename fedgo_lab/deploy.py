"""A local deployment on one machine, as users deploy on many: one SuperLink and N SuperNodes
as separate processes, with TLS (a CA and a server certificate made here) and SuperNode
authentication (one EC key pair per node, each public key registered with the SuperLink).

    python -m fedgo_lab.deploy up DIR [--nodes 3] [--port 9300] [--insecure] [--no-auth]
                        [--node-data FOLDER ...]
    flwr run . local-deployment --stream           # FLWR_HOME=DIR/flwr-home, printed by `up`
    python -m fedgo_lab.deploy down DIR

(The harness is not in the wheel: no console command.)

`up` writes everything under DIR (certificates/, keys/, logs/, state.db, flwr-home/ with the
`[superlink.local-deployment]` connection, pids.json) and returns once every SuperNode is
connected; `down` stops, by PID, every process `up` started. On real hosts the same commands
run one per host: docs/deployment.md.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

FEDERATION = "local-deployment"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key, path: Path, fmt=serialization.PrivateFormat.PKCS8) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_certificates(folder: Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    """A CA (ca.crt) and a server certificate signed by it (server.pem, server.key) valid for
    `hosts` (IP addresses or DNS names), as the SuperLink's --ssl-* flags take them."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fedgo-flwr CA"))
          .issuer_name(_name("fedgo-flwr CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, paths["key"])
    return paths


def make_node_keys(folder: Path, nodes: int) -> list[tuple[Path, Path]]:
    """One EC key pair per SuperNode in OpenSSH format (node-<i>, node-<i>.pub), the form
    `flower-supernode --auth-supernode-private-key` and `flwr supernode register` read."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = folder / f"node-{i}", folder / f"node-{i}.pub"
        _write_key(key, private, serialization.PrivateFormat.OpenSSH)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                         serialization.PublicFormat.OpenSSH))
        pairs.append((private, public))
    return pairs


def write_connection(flwr_home: Path, address: str, ca: Path | None) -> Path:
    """$FLWR_HOME/config.toml with the `[superlink.local-deployment]` connection for flwr."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    security = f'root-certificates = "{ca.resolve()}"' if ca else "insecure = true"
    path = flwr_home / "config.toml"
    path.write_text(f'[superlink.{FEDERATION}]\naddress = "{address}"\n{security}\n')
    return path


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _spawn(cmd: list[str], log: Path, env: dict) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True).pid


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f}s")
        time.sleep(0.5)


def _connected_nodes(env: dict) -> int:
    out = subprocess.run([_bin("flwr"), "supernode", "list", FEDERATION, "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=60)
    try:
        nodes = json.loads(out.stdout).get("nodes", [])
    except json.JSONDecodeError:
        return 0
    return sum(1 for n in nodes if str(n.get("status", "")).lower() == "online")


def up(folder: Path, nodes: int = 3, port: int = 9300, secure: bool = True,
       auth: bool = True, timeout: float = 120.0,
       node_data: list[Path] | None = None) -> dict:
    """Start a SuperLink and `nodes` SuperNodes (partition i of `nodes`) on 127.0.0.1;
    with `node_data`, SuperNode i trains on its own folder node_data[i] (its `dataset-path`)
    instead of a partition. Returns the environment for `flwr` (FLWR_HOME) and the PIDs, also
    saved to pids.json."""
    if node_data is not None and len(node_data) != nodes:
        raise ValueError(f"{len(node_data)} data folders for {nodes} SuperNodes")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if auth and not secure:
        raise ValueError("SuperNode authentication needs TLS: drop --insecure or use --no-auth")
    # Flower starts its SuperExec and app processes by name: they must be on PATH.
    env = {**os.environ, "FLWR_HOME": str(folder / "flwr-home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    address = f"127.0.0.1:{port}"
    try:
        return _start(folder, env, address, nodes, port, secure, auth, timeout, node_data)
    except BaseException:
        down(folder)  # nothing half-started is left behind
        raise


def _start(folder: Path, env: dict, address: str, nodes: int, port: int, secure: bool,
           auth: bool, timeout: float, node_data: list[Path] | None) -> dict:
    certs = make_certificates(folder / "certificates", ["127.0.0.1", "localhost"]) if secure else None
    write_connection(folder / "flwr-home", address, certs["ca"] if certs else None)
    tls = (["--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile", str(certs["cert"]),
            "--ssl-keyfile", str(certs["key"])] if certs else ["--insecure"])
    pids = {"superlink": _spawn(
        [_bin("flower-superlink"), *tls, "--host", "127.0.0.1", "--port", str(port),
         "--database", str(folder / "state.db"), "--disable-runtime-dependency-installation",
         *(["--enable-supernode-auth"] if auth else [])],
        folder / "logs" / "superlink.log", env), "supernodes": []}
    _save(folder, pids)
    _wait_for(lambda: subprocess.run([_bin("flwr"), "ls", FEDERATION], env=env,
                                     capture_output=True, timeout=60).returncode == 0,
              timeout, f"the SuperLink on {address} did not answer (logs/superlink.log)")
    keys = make_node_keys(folder / "keys", nodes) if auth else [(None, None)] * nodes
    for i, (private, public) in enumerate(keys):
        if auth:
            subprocess.run([_bin("flwr"), "supernode", "register", str(public), FEDERATION],
                           env=env, check=True, capture_output=True, timeout=60)
        node_tls = ["--root-certificates", str(certs["ca"])] if certs else ["--insecure"]
        pids["supernodes"].append(_spawn(
            [_bin("flower-supernode"), *node_tls, "--superlink", address,
             "--port", str(port + 1 + i),
             "--node-config", f"partition-id={i} num-partitions={nodes}" + (
                 f' dataset-path="{Path(node_data[i]).resolve()}"' if node_data else ""),
             *(["--auth-supernode-private-key", str(private)] if auth else [])],
            folder / "logs" / f"supernode-{i}.log", env))
        _save(folder, pids)
    _wait_for(lambda: _connected_nodes(env) >= nodes, timeout,
              f"only {_connected_nodes(env)} of {nodes} SuperNodes connected (logs/)")
    return {"env": env, "pids": pids, "address": address}


def _save(folder: Path, pids: dict) -> None:
    (folder / "pids.json").write_text(json.dumps(pids))


def down(folder: Path, grace: float = 10.0) -> list[int]:
    """Stop every process `up` started in `folder` (SuperNodes first), by PID and process
    group (their ClientApp and ServerApp subprocesses too); returns the PIDs signalled."""
    path = Path(folder) / "pids.json"
    if not path.exists():
        return []
    pids = json.loads(path.read_text())
    order = [*pids["supernodes"], pids["superlink"]]
    for pid in order:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in order:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    path.unlink()
    return order


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as stopped
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.deploy",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="Then: flwr run . local-deployment --stream, with "
                                            "the FLWR_HOME `up` prints. On real hosts: "
                                            "docs/deployment.md.")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="start a SuperLink and N SuperNodes")
    start.add_argument("dir", type=Path, help="where certificates, keys, logs, the state and "
                       "flwr-home/ go")
    start.add_argument("--nodes", type=int, default=3,
                       help="SuperNodes, one partition each (default: %(default)s)")
    start.add_argument("--port", type=int, default=9300,
                       help="the SuperLink's port; SuperNode i uses port + 1 + i")
    start.add_argument("--insecure", action="store_true", help="no TLS (and no node auth)")
    start.add_argument("--no-auth", action="store_true", help="TLS without node authentication")
    start.add_argument("--node-data", type=Path, nargs="+", metavar="FOLDER",
                       help="each SuperNode's own image folder (its dataset-path), one per node")
    stop = sub.add_parser("down", help="stop what `up` started")
    stop.add_argument("dir", type=Path, help="the folder given to `up`")
    args = parser.parse_args(argv)
    if args.command == "down":
        print(f"[deploy] stopped PIDs {down(args.dir)}")
        return 0
    try:
        info = up(args.dir, args.nodes, args.port, secure=not args.insecure,
                  auth=not (args.insecure or args.no_auth), node_data=args.node_data)
    except (TimeoutError, subprocess.CalledProcessError, ValueError) as err:
        print(f"[deploy] failed, everything started was stopped: {err}")
        return 1
    print(f"[deploy] SuperLink {info['address']} (PID {info['pids']['superlink']}), "
          f"SuperNodes {info['pids']['supernodes']}; now run:\n"
          f"  FLWR_HOME={info['env']['FLWR_HOME']} flwr run . {FEDERATION} --stream\n"
          f"  python -m fedgo_lab.deploy down {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
