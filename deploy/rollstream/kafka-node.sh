#!/bin/sh
# One KRaft node from the Kafka jars in $KAFKA_LIB, configured like the apache/kafka image:
# every KAFKA_FOO_BAR variable becomes foo.bar in server.properties (KAFKA_NODE_ID ->
# node.id, ...), CLUSTER_ID formats the data dir on first start. So compose.yaml's Kafka
# services run unchanged on apache/kafka (KAFKA_IMAGE=apache/kafka:4.1.0).
set -eu
LIB=${KAFKA_LIB:-/opt/kafka/lib}
CONF=${KAFKA_CONF_DIR:-/var/lib/kafka/config}
DATA=${KAFKA_LOG_DIRS:-/var/lib/kafka/data}
mkdir -p "$CONF" "$DATA"
PROPS="$CONF/server.properties"
: > "$PROPS"
env | sort | while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_LIB|KAFKA_CONF_DIR) ;;
    KAFKA_*)
      key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')
      printf '%s=%s\n' "$key" "$value" >> "$PROPS" ;;
  esac
done
grep -q '^log.dirs=' "$PROPS" || echo "log.dirs=$DATA" >> "$PROPS"
JAVA="java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m} -XX:+UseG1GC -Djava.awt.headless=true"
LOG4J=/opt/rollstream/deploy/kafka/log4j2.xml
if [ ! -f "$DATA/meta.properties" ]; then
  $JAVA -Dlog4j2.configurationFile=$LOG4J -cp "$LIB/*" kafka.tools.StorageTool format \
    -t "${CLUSTER_ID:?set CLUSTER_ID (the same on every node)}" -c "$PROPS"
fi
exec $JAVA -Dlog4j2.configurationFile=$LOG4J -cp "$LIB/*" kafka.Kafka "$PROPS"
