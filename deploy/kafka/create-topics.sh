#!/usr/bin/env bash
# Create (or check) weft's topics with the settings of deploy/kafka/topics.yaml.
# Runs inside the apache/kafka image (compose service `kafka-init`) or anywhere Kafka's
# bin/ tools are on PATH:  KAFKA_BOOTSTRAP=host:9092 deploy/kafka/create-topics.sh
#
# Environment:
#   KAFKA_BOOTSTRAP     bootstrap servers (default kafka:9092)
#   KAFKA_BIN           folder of kafka-topics.sh (default /opt/kafka/bin)
#   REPLICATION_FACTOR  default 3; the single-broker compose stack sets 1
#   MIN_INSYNC          min.insync.replicas, default 2; the compose stack sets 1
#   TOPIC_PREFIX        default "weaver." (must match [publisher.topics] prefix)
set -euo pipefail

KAFKA_BOOTSTRAP="${KAFKA_BOOTSTRAP:-kafka:9092}"
KAFKA_BIN="${KAFKA_BIN:-/opt/kafka/bin}"
REPLICATION_FACTOR="${REPLICATION_FACTOR:-3}"
MIN_INSYNC="${MIN_INSYNC:-2}"
TOPIC_PREFIX="${TOPIC_PREFIX:-weaver.}"

# name partitions retention.ms  (keep in step with topics.yaml; a test compares them)
TOPICS="
trace_events 12 604800000
policy_decisions 6 604800000
execution_feedback 6 604800000
execution_routing_decisions 6 604800000
routing_decisions 6 604800000
frames 6 604800000
handles 6 604800000
capability_tokens 6 604800000
dead_letter 3 2592000000
"

while read -r name partitions retention; do
    [ -n "$name" ] || continue
    topic="${TOPIC_PREFIX}${name}"
    "$KAFKA_BIN/kafka-topics.sh" --bootstrap-server "$KAFKA_BOOTSTRAP" --create --if-not-exists \
        --topic "$topic" --partitions "$partitions" --replication-factor "$REPLICATION_FACTOR" \
        --config "min.insync.replicas=$MIN_INSYNC" \
        --config "retention.ms=$retention" \
        --config cleanup.policy=delete \
        --config compression.type=producer \
        --config max.message.bytes=8388608
    echo "topic $topic: $partitions partitions, retention.ms=$retention"
done <<< "$TOPICS"
