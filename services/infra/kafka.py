"""The local Apache Kafka broker: KRaft, jars from Maven Central.

Fetched once with Maven into the cache dir, formatted once, started as a background
process with its data and log under the state dir, bound to 127.0.0.1 only. One node by
default (`kafka/` under the state dir); with `kafka.brokers` N > 1, N combined
broker+controller nodes (`kafka-1/` .. `kafka-N/`, ports spaced by `kafka.node_port_step`)
forming a controller quorum of N with a static voter set.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.infra.common import (
    DEPLOY_DIR,
    Check,
    StackError,
    ensure_debian_packages,
    port_open,
)
from services.infra.procs import ManagedProcess
from services.settings import Settings

POM = DEPLOY_DIR / "kafka" / "pom.xml"
LOG4J = DEPLOY_DIR / "kafka" / "log4j2.xml"


@dataclass(frozen=True)
class Node:
    """One local node: a combined broker and controller."""

    node_id: int
    port: int
    controller_port: int
    proc: ManagedProcess

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def nodes(settings: Settings) -> list[Node]:
    """The local nodes `kafka.brokers` asks for (one named `kafka`, or `kafka-1`..)."""
    state, ports = settings.stack.state_dir, settings.kafka.node_ports()
    if len(ports) == 1:
        return [Node(1, *ports[0], ManagedProcess("kafka", state))]
    return [Node(i, p, c, ManagedProcess(f"kafka-{i}", state)) for i, (p, c) in enumerate(ports, 1)]


def process(settings: Settings) -> ManagedProcess:
    """The first local node's process (the only one of a single-node stack)."""
    return nodes(settings)[0].proc


def all_processes(settings: Settings) -> list[ManagedProcess]:
    """Every local node process under the state dir, configured or left from another
    `kafka.brokers` value, so that `rollstream down` stops them all."""
    found = {n.proc.name: n.proc for n in nodes(settings)}
    state = settings.stack.state_dir
    for pid_file in sorted(state.glob("kafka*/kafka*.pid")):
        name = pid_file.stem
        if name == pid_file.parent.name and (name == "kafka" or name[6:].isdigit()):
            found.setdefault(name, ManagedProcess(name, state))
    return list(found.values())


def stop_all(settings: Settings, timeout_s: float = 30.0) -> list[tuple[str, bool]]:
    """Stop every node at once: a node stopped alone waits for a quorum that is leaving."""
    procs = all_processes(settings)
    with ThreadPoolExecutor(max_workers=len(procs)) as pool:
        stopped = list(pool.map(lambda p: p.stop(timeout_s=timeout_s), procs))
    return [(p.name, s) for p, s in zip(procs, stopped, strict=True)]


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


def server_properties(settings: Settings, data_dir: Path, node: Node | None = None) -> str:
    """The broker's configuration; node: one node of a multi-node cluster."""
    if node is not None and settings.kafka.brokers > 1:
        return _cluster_properties(settings, data_dir, node)
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


def _cluster_properties(settings: Settings, data_dir: Path, node: Node) -> str:
    k, all_nodes = settings.kafka, nodes(settings)
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in all_nodes)
    rf, isr = min(3, k.brokers), 2 if k.brokers >= 3 else 1
    return "\n".join(
        [
            "# Written by `rollstream up`; edits are overwritten.",
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            f"default.replication.factor={rf}",
            f"min.insync.replicas={isr}",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={isr}",
            "transaction.state.log.num.partitions=4",
            f"share.coordinator.state.topic.replication.factor={rf}",
            f"share.coordinator.state.topic.min.isr={isr}",
            "group.initial.rebalance.delay.ms=0",
            # A restarted node catches up and takes its partitions back quickly.
            "leader.imbalance.check.interval.seconds=10",
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


def _cluster_id(settings: Settings) -> str:
    """The id every node of the local cluster was (or will be) formatted with."""
    for n in nodes(settings):
        meta = n.proc.dir / "data" / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.partition("=")[2].strip()
    return new_cluster_id()


def new_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random cluster id (16 bytes, URL-safe base64, as `kafka-storage random-uuid`
    makes them), drawn again while it starts with `-`: the storage tool's argument parser
    would read such an id as an option (1 draw in 64 failed to format the data dirs)."""
    while True:
        cid = base64.urlsafe_b64encode(draw()).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def ensure_formatted(settings: Settings, lib: Path, node: Node | None = None) -> Path:
    """Write server.properties and format the node's data dir once; return the properties
    path. node: a node of a multi-node cluster (default: the first/only node)."""
    node = node or nodes(settings)[0]
    proc = node.proc
    data = proc.dir / "data"
    props = proc.dir / "server.properties"
    proc.dir.mkdir(parents=True, exist_ok=True)
    props.write_text(server_properties(settings, data, node))
    if (data / "meta.properties").exists():
        return props
    # One node: a dynamic quorum of itself. Several: the static voter set in the file.
    quorum = ["--standalone"] if settings.kafka.brokers == 1 else []
    argv = _java_argv(
        settings, lib, "kafka.tools.StorageTool", "format", *quorum,
        "-t", _cluster_id(settings), "-c", str(props),
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
    """Ask the cluster for its metadata. A local cluster of N nodes is healthy when all N
    brokers are registered; any other cluster when it has a broker."""
    k = settings.kafka
    alive = [n.proc.pid() is not None for n in nodes(settings)]
    check = Check("kafka", False, k.endpoint, managed=k.managed and any(alive))
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
    ids = sorted(int(b["node_id"]) for b in brokers)  # type: ignore[attr-defined]
    check.extra = {"cluster_id": info.get("cluster_id"), "broker_ids": ids}
    if k.managed and k.brokers > 1:
        # A node killed a moment ago stays registered until its session times out.
        down = alive.count(False)
        check.healthy = len(ids) >= k.brokers and not down
        check.detail = f"cluster {info.get('cluster_id')}, {len(ids)}/{k.brokers} broker(s)"
        check.detail += f", {down} node(s) not running" if down else ""
        if not check.healthy:
            check.fix = f"run `rollstream up --brokers {k.brokers}` to restart the nodes down"
        return check
    check.healthy = bool(brokers)
    check.detail = f"cluster {info.get('cluster_id')}, {len(brokers)} broker(s)"  # type: ignore[arg-type]
    return check


def probe_nodes(settings: Settings, cluster: Check) -> list[Check]:
    """The doctor's line per node of a multi-node local cluster (none for one node)."""
    if not settings.kafka.managed or settings.kafka.brokers == 1:
        return []
    ids = cluster.extra.get("broker_ids")
    registered = set(ids) if isinstance(ids, list) else set()
    out = []
    for n in nodes(settings):
        alive = n.proc.pid() is not None
        listening = alive and port_open("127.0.0.1", n.port)
        check = Check(n.proc.name, False, n.endpoint, version=f"node {n.node_id}", managed=alive)
        if not alive:
            check.detail = "not running"
        elif not listening:
            check.detail = "running, not listening yet"
        elif n.node_id not in registered:
            check.detail = "listening, not registered in the cluster"
        else:
            check.healthy, check.detail = True, "broker+controller, registered"
        if not check.healthy:
            brokers = settings.kafka.brokers
            check.fix = f"run `rollstream up --brokers {brokers}`; read {n.proc.log_file}"
        out.append(check)
    return out


def _start_node(settings: Settings, node: Node, lib: Path) -> None:
    if settings.kafka.brokers > 1:
        taken = [p for p in (node.port, node.controller_port) if port_open("127.0.0.1", p)]
        if taken:
            raise StackError(
                f"{node.proc.name}: port(s) {taken} are taken by a process this stack did not "
                f"start (another stack's broker?); give the cluster its own kafka.port, "
                f"kafka.controller_port and stack.state_dir"
            )
    props = ensure_formatted(settings, lib, node)
    node.proc.start(_java_argv(settings, lib, "kafka.Kafka", str(props)))


def up(settings: Settings) -> Check:
    """Use the cluster that answers whole, or fetch, format and start the local node(s)
    not running (all of them, or the ones that died)."""
    current = probe(settings, timeout_s=3.0)
    if current.healthy or not settings.kafka.managed:
        current.detail = ("reused: " if current.healthy else "") + current.detail
        return current
    started = [n for n in nodes(settings) if n.proc.pid() is None]
    if started:
        lib = fetch_jars(settings)
        for node in started:
            _start_node(settings, node, lib)
    deadline = time.monotonic() + settings.kafka.start_timeout_s
    while time.monotonic() < deadline:
        for node in started:
            if node.proc.pid() is None:
                raise StackError(
                    f"the Kafka broker {node.proc.name} exited during start-up; read "
                    f"{node.proc.log_file}:\n" + node.proc.log_tail(15)
                )
        check = probe(settings, timeout_s=3.0)
        if check.healthy:
            check.managed = True
            whom = "" if settings.kafka.brokers == 1 else f"{len(started)} node(s), "
            check.detail = f"started: {whom}{check.detail}"
            return check
        time.sleep(0.5)
    raise StackError(
        f"the Kafka broker did not answer within {settings.kafka.start_timeout_s:.0f}s; "
        f"read {', '.join(str(n.proc.log_file) for n in started) or 'its log'}"
    )
