"""Local stack provisioning: Kafka (KRaft), Redis, a Docker engine and the sandbox image."""
