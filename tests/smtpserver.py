"""A real SMTP server process for the email tests: aiosmtpd on 127.0.0.1, with or without STARTTLS.

``python -m tests.smtpserver --mailbox DIR [--port N] [--tls-cert C --tls-key K] [--crash-at N]`` prints
``PORT <n>`` once it listens (port 0 by default: the kernel picks; a restart names the port it had). Every
message received is appended to ``DIR/journal.jsonl`` (Message-ID, envelope recipients, Subject) and fsynced
*before* the answer, then stored once per Message-ID in ``DIR/<sha>.eml``: the deduplication by Message-ID that
receiving servers and mail programs do, so the journal shows every retry and the mailbox what a recipient sees.
``--crash-at N``: on the N-th message the server stores it and exits at once without answering, the worst
moment for a sender (the message arrived, the sender cannot know).

:class:`SmtpServer` starts and stops one from a test.
"""

from __future__ import annotations

import argparse
import asyncio
import email
import email.policy
import hashlib
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Mailbox:
    def __init__(self, folder: Path, crash_at: int | None) -> None:
        self.folder = folder
        self.crash_at = crash_at
        self.count = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.count += 1
        content = envelope.content if isinstance(envelope.content, bytes) else envelope.content.encode()
        message = email.message_from_bytes(content, policy=email.policy.default)
        message_id = str(message.get("Message-ID", ""))
        entry = {"message_id": message_id, "rcpt": list(envelope.rcpt_tos), "mail_from": envelope.mail_from,
                 "subject": str(message.get("Subject", "")), "tls": session.ssl is not None}
        with (self.folder / "journal.jsonl").open("a") as journal:
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
        name = hashlib.sha256(message_id.encode()).hexdigest()[:24]
        target = self.folder / f"{name}.eml"
        if not target.exists():
            temp = target.with_suffix(".tmp")
            temp.write_bytes(content)
            os.replace(temp, target)
        if self.crash_at is not None and self.count == self.crash_at:
            os._exit(3)
        return f"250 2.0.0 Ok: queued as {name[:12]}"


async def serve(args: argparse.Namespace) -> None:
    from aiosmtpd.smtp import SMTP

    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    handler = Mailbox(Path(args.mailbox), args.crash_at)
    loop = asyncio.get_running_loop()
    if args.implicit_tls:  # TLS from the first byte (port 465 style): no STARTTLS inside
        server = await loop.create_server(lambda: SMTP(handler, hostname="mail.test"), host="127.0.0.1",
                                          port=args.port, ssl=tls)
    else:
        server = await loop.create_server(
            lambda: SMTP(handler, hostname="mail.test", tls_context=tls, require_starttls=tls is not None),
            host="127.0.0.1", port=args.port,
        )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class SmtpServer:
    """One server process; ``restart`` brings it back on the same port."""

    def __init__(self, mailbox: Path, *, tls: tuple[Path, Path] | None = None, implicit_tls: bool = False) -> None:
        self.mailbox = mailbox
        self.implicit_tls = implicit_tls
        mailbox.mkdir(parents=True, exist_ok=True)
        self.tls = tls
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    def start(self, *, crash_at: int | None = None) -> SmtpServer:
        command = [sys.executable, "-m", "tests.smtpserver", "--mailbox", str(self.mailbox), "--port", str(self.port)]
        if self.tls:
            command += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
            if self.implicit_tls:
                command.append("--implicit-tls")
        if crash_at is not None:
            command += ["--crash-at", str(crash_at)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("PORT "), f"the SMTP server did not start: {line!r}"
        self.port = int(line.split()[1])
        return self

    def wait_ended(self) -> int | None:
        assert self.process is not None
        return self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def journal(self) -> list[dict[str, Any]]:
        path = self.mailbox / "journal.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def messages(self) -> list[email.message.EmailMessage]:
        out = []
        for path in sorted(self.mailbox.glob("*.eml")):
            parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
            assert isinstance(parsed, email.message.EmailMessage)
            out.append(parsed)
        return out

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, made now with ``cryptography`` (cert.pem, key.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--implicit-tls", action="store_true")
    asyncio.run(serve(parser.parse_args()))
