"""The local Apache Kafka broker: KRaft, single node, jars from Maven Central.

Fetched once with Maven into the cache dir, formatted once, started as a background
process with its data and log under the state dir, bound to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from services.infra.common import DEPLOY_DIR, Check, StackError, ensure_debian_packages
from services.infra.procs import ManagedProcess
from services.settings import Settings

POM = DEPLOY_DIR / "kafka" / "pom.xml"
LOG4J = DEPLOY_DIR / "kafka" / "log4j2.xml"


def process(settings: Settings) -> ManagedProcess:
    return ManagedProcess("kafka", settings.stack.state_dir)


def lib_dir(settings: Settings) -> Path:
    return settings.stack.cache_dir / f"kafka-{settings.kafka.version}" / "lib"


def fetch_jars(settings: Settings) -> Path:
    """Download the broker jars once (Maven copy-dependencies); return the lib dir."""
    lib = lib_dir(settings)
    if (lib / ".complete").exists():
        return lib
    ensure_debian_packages({"java": "default-jre-headless", "mvn": "maven"})
    tmp = lib.with_name("lib.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        "mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
        f"-Dkafka.version={settings.kafka.version}", f"-DoutputDirectory={tmp}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        raise StackError(
            f"fetching Kafka {settings.kafka.version} with Maven failed "
            f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr).strip()[-2000:]}\n"
            f"retry by hand: {' '.join(cmd)}"
        )
    (tmp / ".complete").write_text(settings.kafka.version)
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
    return lib


def server_properties(settings: Settings, data_dir: Path) -> str:
    k = settings.kafka
    return "\n".join(
        [
            "# Written by `rollstream up`; edits are overwritten.",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{k.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{k.port},CONTROLLER://127.0.0.1:{k.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{k.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            # Topics are declared in schemas/topics.py and created explicitly.
            "auto.create.topics.enable=false",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            # Large trajectories travel by claim check; allow some headroom inline.
            "message.max.bytes=4194304",
            "",
        ]
    )


def _java_argv(settings: Settings, lib: Path, *args: str) -> list[str]:
    return [
        "java", f"-Xmx{settings.kafka.heap}", "-Xms128m", "-XX:+UseG1GC",
        "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J}",
        "-cp", f"{lib}/*", *args,
    ]  # fmt: skip


def ensure_formatted(settings: Settings, lib: Path) -> Path:
    """Write server.properties and format the data dir once; return the properties path."""
    proc = process(settings)
    data = proc.dir / "data"
    props = proc.dir / "server.properties"
    proc.dir.mkdir(parents=True, exist_ok=True)
    props.write_text(server_properties(settings, data))
    if (data / "meta.properties").exists():
        return props
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    argv = _java_argv(
        settings, lib, "kafka.tools.StorageTool", "format", "--standalone",
        "-t", cluster_id, "-c", str(props),
    )  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise StackError(f"formatting Kafka storage failed:\n{out.stdout[-1500:]}{out.stderr}")
    return props


async def _describe(settings: Settings, timeout_s: float) -> dict[str, object]:
    from services import kafka

    # A broker that is down is reported by the Check (kafka.admin quiets aiokafka's log).
    admin = kafka.admin(settings, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        info = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        return dict(info)
    finally:
        await admin.close()


def probe(settings: Settings, timeout_s: float = 5.0) -> Check:
    """Ask the broker for its cluster metadata."""
    k = settings.kafka
    check = Check(
        "kafka", False, k.endpoint, managed=k.managed and process(settings).pid() is not None
    )
    if k.managed:
        check.version = k.version
    try:
        info = asyncio.run(_describe(settings, timeout_s))
    except Exception as exc:
        check.detail = f"not answering at {k.endpoint}: {type(exc).__name__}: {exc}".strip()
        if k.managed:
            log = process(settings).log_file
            check.fix = f"run `rollstream up`; if it fails, read {log}"
        else:
            check.fix = f"check the configured cluster kafka.bootstrap={k.bootstrap}"
        return check
    brokers = info.get("brokers") or []
    check.healthy = bool(brokers)
    check.detail = f"cluster {info.get('cluster_id')}, {len(brokers)} broker(s)"  # type: ignore[arg-type]
    check.extra = {"cluster_id": info.get("cluster_id")}
    return check


def up(settings: Settings) -> Check:
    """Use the broker that answers, or fetch, format and start the local one."""
    current = probe(settings, timeout_s=3.0)
    if current.healthy or not settings.kafka.managed:
        current.detail = ("reused: " if current.healthy else "") + current.detail
        return current
    proc = process(settings)
    if proc.pid() is None:
        lib = fetch_jars(settings)
        props = ensure_formatted(settings, lib)
        proc.start(_java_argv(settings, lib, "kafka.Kafka", str(props)))
    deadline = time.monotonic() + settings.kafka.start_timeout_s
    while time.monotonic() < deadline:
        if proc.pid() is None:
            raise StackError(
                f"the Kafka broker exited during start-up; read {proc.log_file}:\n"
                + proc.log_tail(15)
            )
        check = probe(settings, timeout_s=3.0)
        if check.healthy:
            check.managed = True
            check.detail = "started: " + check.detail
            return check
        time.sleep(0.5)
    raise StackError(
        f"the Kafka broker did not answer within {settings.kafka.start_timeout_s:.0f}s; "
        f"read {proc.log_file}"
    )
