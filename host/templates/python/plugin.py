"""{{name}}: a sharehost plugin. It rejects tombstones and values larger than `max-bytes`
(plugin config, default 1024) and accepts the rest. Change `handle_record` to judge your
records."""

from sharehost_guest import ConfigError, Plugin, accept, reject


class {{type}}(Plugin):
    def init(self, config):
        raw = config.get("max-bytes", "1024")
        if not raw.isdigit():
            raise ConfigError(f"max-bytes `{raw}` is not a whole number")
        self.max = int(raw)

    def handle_record(self, record):
        if record.value is None:
            return reject("tombstone")
        if len(record.value) > self.max:
            print(f"offset {record.offset}: {len(record.value)} B")
            return reject(f"{len(record.value)} bytes > {self.max}")
        return accept()
