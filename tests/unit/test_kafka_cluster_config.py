"""kafka.brokers: per-node ports and state dirs, the cluster's server.properties, and the
single-node default left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import topics as registry
from services.config import KafkaSettings
from services.infra import kafka
from services.settings import load
from services.topics import replication, topic_configs


def test_single_node_default_is_unchanged(tmp_path: Path) -> None:
    s = load([f"stack.state_dir={tmp_path}"])
    assert s.kafka.brokers == 1 and s.kafka.endpoint == "127.0.0.1:9092"
    (node,) = kafka.nodes(s)
    assert (node.node_id, node.port, node.controller_port) == (1, 9092, 9093)
    assert node.proc.dir == tmp_path / "kafka"
    props = kafka.server_properties(s, tmp_path / "data", node)
    assert "node.id=1\n" in props and "controller.quorum.bootstrap.servers=127.0.0.1:9093" in props
    assert "offsets.topic.replication.factor=1" in props and "voters" not in props


def test_three_nodes_get_their_own_ports_dirs_and_a_quorum_of_three(tmp_path: Path) -> None:
    s = load([f"stack.state_dir={tmp_path}", "kafka.brokers=3", "kafka.port=19092",
              "kafka.controller_port=19093"])  # fmt: skip
    nodes = kafka.nodes(s)
    assert [(n.port, n.controller_port) for n in nodes] == [
        (19092, 19093), (19102, 19103), (19112, 19113)
    ]  # fmt: skip
    assert [n.proc.dir.name for n in nodes] == ["kafka-1", "kafka-2", "kafka-3"]
    assert s.kafka.endpoint == "127.0.0.1:19092,127.0.0.1:19102,127.0.0.1:19112"
    props = kafka.server_properties(s, tmp_path / "d", nodes[1]).splitlines()
    assert "node.id=2" in props
    assert "controller.quorum.voters=1@127.0.0.1:19093,2@127.0.0.1:19103,3@127.0.0.1:19113" in props
    assert "listeners=PLAINTEXT://127.0.0.1:19102,CONTROLLER://127.0.0.1:19103" in props
    for line in ("min.insync.replicas=2", "offsets.topic.replication.factor=3",
                 "transaction.state.log.min.isr=2", "default.replication.factor=3"):  # fmt: skip
        assert line in props


def test_colliding_ports_are_rejected() -> None:
    with pytest.raises(ValidationError, match="distinct ports"):
        KafkaSettings(brokers=3, port=9092, controller_port=9094, node_port_step=2)
    with pytest.raises(ValidationError):
        KafkaSettings(brokers=3, port=65530)


def test_down_finds_every_node_under_the_state_dir(tmp_path: Path) -> None:
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.pid").write_text("{}")
    s = load([f"stack.state_dir={tmp_path}"])  # brokers=1: the others are found anyway
    names = [p.name for p in kafka.all_processes(s)]
    assert names == ["kafka", "kafka-1", "kafka-2", "kafka-3"]


def test_replication_follows_the_broker_count() -> None:
    assert [replication(n) for n in (1, 2, 3, 5)] == [1, 1, 3, 3]
    assert "min.insync.replicas" not in topic_configs(registry.TRAJECTORIES, 1)
    assert topic_configs(registry.TRAJECTORIES, 3)["min.insync.replicas"] == "2"


def test_new_cluster_id_never_starts_with_a_dash() -> None:
    draws = iter([b"\xf8" + bytes(15), b"\x10" + bytes(15)])  # the first encodes to "-..."
    cid = kafka.new_cluster_id(lambda: next(draws))
    assert cid == "EAAAAAAAAAAAAAAAAAAAAA"
    assert len(kafka.new_cluster_id()) == 22
