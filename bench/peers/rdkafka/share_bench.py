#!/usr/bin/env python3
"""dev/bench's librdkafka peer: confluent-kafka-python's ShareConsumer (librdkafka's preview KIP-932).

Reads N records of one topic in one share group with share.acknowledgement.mode=explicit: every message gets an
explicit ACCEPT (acknowledge), and every poll ends with commit_async(), as the client's docs describe explicit mode.
After the N-th record the consumer closes (close() commits what is left and leaves the group). Outcomes of the
commits reach an acknowledgement-commit callback that counts failures.

Usage: share_bench.py BOOTSTRAP TOPIC GROUP N   (the venv is made by dev/bench from requirements.txt beside this)
Output on stdout, one key=value per line: launch_us, first_us, last_us (microseconds since the Unix epoch),
records, commit_failures.
"""
import sys
import time

LAUNCH_US = time.time_ns() // 1000

from confluent_kafka import ShareConsumer  # noqa: E402
from confluent_kafka._model import AcknowledgeType  # noqa: E402

IDLE_LIMIT_S = 120


def now_us():
    """Microseconds since the Unix epoch: dev/bench's time base for every consumer kind."""
    return time.time_ns() // 1000


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: share_bench.py BOOTSTRAP TOPIC GROUP N")
    bootstrap, topic, group, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    failures = [0]

    def on_commit(offsets, error):
        # Called with (acknowledged offsets per partition, KafkaException or None) once the broker answers.
        if error is not None:
            failures[0] += 1
            print(f"commit failed: {error}", file=sys.stderr)

    consumer = ShareConsumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "rdkafka-share-bench",
        "share.acknowledgement.mode": "explicit",
    })
    consumer.set_acknowledgement_commit_callback(on_commit)
    consumer.subscribe([topic])
    read = 0
    first = last = 0
    idle_since = time.monotonic()
    while read < want:
        messages = consumer.poll(1.0)
        got = 0
        for m in messages:
            if m.error() is not None:
                print(f"poll error: {m.error()}", file=sys.stderr)
                continue
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            got += 1
        if got == 0:
            if time.monotonic() - idle_since > IDLE_LIMIT_S:
                sys.exit(f"no record for {IDLE_LIMIT_S} s after {read} of {want}")
            continue
        idle_since = time.monotonic()
        if first == 0:
            first = now_us()
        read += got
        consumer.commit_async()
        if read >= want:
            last = now_us()
    consumer.close()
    print(f"launch_us={LAUNCH_US}\nfirst_us={first}\nlast_us={last}\nrecords={read}\ncommit_failures={failures[0]}")


if __name__ == "__main__":
    main()
