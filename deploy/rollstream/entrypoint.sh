#!/bin/sh
# The rollstream image's entrypoint: `rollstream ARGS`, or a KRaft node when KAFKA_NODE_ID
# is set and no arguments are given (kafka-node.sh), or a plain program (redis-server, sh).
set -eu
HERE=$(dirname "$0")
if [ $# -eq 0 ] && [ -n "${KAFKA_NODE_ID:-}" ]; then
  exec "$HERE/kafka-node.sh"
fi
case "${1:-}" in
  redis-server|java|sh|bash|python|python3) exec "$@" ;;
esac
exec python -m services.cli "$@"
