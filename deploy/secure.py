"""TLS certificates and SuperNode key pairs for a secure Flower deployment, made with `cryptography`.

    python deploy/secure.py certs DIR --host server.example.org [--host 10.0.0.5]
        -> DIR/ca.crt, DIR/ca.key, DIR/server.pem, DIR/server.key (server certificate signed by the CA,
           valid for every --host as DNS name or IP address, plus localhost / 127.0.0.1)
    python deploy/secure.py node-keys DIR --nodes 3
        -> DIR/node0 (private key, OpenSSH PEM) and DIR/node0.pub (OpenSSH public key), ...

SuperLink: `--ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key
--enable-supernode-auth`; every SuperNode and the `flwr` CLI trust `ca.crt`; a SuperNode signs in with
its private key after its public key was registered (`flwr supernode register nodeI.pub CONNECTION`).
Keep the `.key` files and the node private keys secret (written with mode 0600).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    """Write `data`; a secret is created 0600 from the start (never readable by others, not even briefly)."""
    if not secret:
        path.write_bytes(data)
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(descriptor, 0o600)  # an existing file keeps its mode on open: set it before writing
        handle.write(data)


def _private_dir(path: Path) -> None:
    """A folder that holds private keys: made 0700 (and tightened to 0700 if it exists)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def make_certificates(out_dir: Path, hosts: list[str] | tuple[str, ...] = ()) -> dict[str, Path]:
    """A CA and a server certificate it signs for `hosts` (+ localhost, 127.0.0.1); returns the paths."""
    _private_dir(out_dir)  # it holds the server key
    now = dt.datetime.now(dt.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedapp CA"))
        .issuer_name(_name("fedapp CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0] if hosts else "localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": out_dir / "ca.crt",
        "ca-key": out_dir / "ca.key",
        "cert": out_dir / "server.pem",
        "key": out_dir / "server.key",
    }
    _write(paths["ca"], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["ca-key"], _pem(ca_key), secret=True)
    _write(paths["cert"], server_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["key"], _pem(server_key), secret=True)
    return paths


def make_node_keys(out_dir: Path, names: list[str]) -> dict[str, tuple[Path, Path]]:
    """One ECDSA P-384 key pair per SuperNode in OpenSSH format (what Flower's node auth loads)."""
    _private_dir(out_dir)
    keys = {}
    for name in names:
        private = ec.generate_private_key(ec.SECP384R1())
        private_path, public_path = out_dir / name, out_dir / f"{name}.pub"
        _write(
            private_path,
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            ),
            secret=True,
        )
        _write(
            public_path,
            private.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            ),
        )
        keys[name] = (private_path, public_path)
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    certs = sub.add_parser("certs", help="a CA and a server certificate")
    certs.add_argument("out", type=Path)
    certs.add_argument("--host", action="append", default=[], help="DNS name or IP address of the SuperLink")
    nodes = sub.add_parser("node-keys", help="SuperNode key pairs for authentication")
    nodes.add_argument("out", type=Path)
    nodes.add_argument("--nodes", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "certs":
        for kind, path in make_certificates(args.out, args.host).items():
            print(f"{kind:8s} {path}")
    else:
        for name, (private, public) in make_node_keys(
            args.out, [f"node{i}" for i in range(args.nodes)]
        ).items():
            print(f"{name}: private {private}, public {public}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
