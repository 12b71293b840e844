//! Defaults, in one place so docs/manifest.md, the validators and the command line's own
//! flags (`sharehost test-plugin`) agree: each is what a manifest gets when it leaves the key
//! out. In the order of the tables they belong to.

/// `[cluster]`: client id sent to the brokers.
pub const CLIENT_ID: &str = "sharehost";

/// `[admin]`: admin listener.
pub const ADMIN_LISTEN: &str = "127.0.0.1:9464";

/// `[runtime]`: largest component file, in MiB.
pub const MAX_COMPONENT_MIB: u64 = crate::runtime::DEFAULT_MAX_COMPONENT_BYTES >> 20;

/// Records per plugin call.
pub const BATCH_SIZE: usize = 100;
/// Records acquired and not yet judged. Several producer batches' worth, so the next
/// fetch leaves while the plugin works and each fetch carries more than one batch (with
/// 1000, 100 B records took about three times the requests and broker CPU; see
/// docs/benchmarks.md).
pub const MAX_IN_FLIGHT: usize = 5000;
/// CPU deadline of one call, in ms.
pub const CPU_DEADLINE_MS: u64 = 5000;
/// Memory cap of one instance, in MiB.
pub const MEMORY_LIMIT_MIB: usize = 64;
/// Batches per instance in reuse mode.
pub const RECYCLE_AFTER: u32 = 1000;
/// Parallel plugin instances.
pub const CONCURRENCY: usize = 1;
/// Renewals per record.
pub const MAX_RENEWALS: u32 = 3;
/// Fraction of the lock duration after which a running batch is renewed.
pub const AUTO_RENEW_AFTER: f64 = 0.5;
/// Longest `retry` delay, in ms (one minute).
pub const MAX_RETRY_DELAY_MS: u64 = 60_000;
/// Fraction of batches a shadow candidate judges.
pub const SHADOW_SAMPLE: f64 = 1.0;

/// Wall-clock deadline of one call, in ms, for a CPU deadline of `cpu_deadline_ms`: the
/// runtime's default number of CPU budgets, so a plugin that waits on HTTP or on a busy
/// machine still gets its whole CPU budget.
pub fn wall_deadline_ms(cpu_deadline_ms: u64) -> u64 {
    cpu_deadline_ms * u64::from(crate::runtime::DEFAULT_WALL_PER_CPU)
}

/// `[fleet]`: how often a host publishes its status, in ms.
pub const FLEET_STATUS_INTERVAL_MS: u64 = 2_000;
/// `[fleet]`: a host whose last status is older than this (ms) is shown stale.
pub const FLEET_STALE_AFTER_MS: u64 = 30_000;
/// `[fleet]`: how long the status topic keeps a host that stopped publishing (ms; one day),
/// so dead hosts age out of `fleet status`.
pub const FLEET_STATUS_RETENTION_MS: u64 = 86_400_000;
/// `[fleet]`: prefix of the fleet's topic names, before the fleet's name.
pub const FLEET_TOPIC_PREFIX: &str = "sharehost.fleet.";

/// Emits per batch (the runtime's own default, so a plugin run without a manifest gets the
/// same bound).
pub const MAX_EMITS_PER_BATCH: u32 = crate::runtime::DEFAULT_MAX_EMITS_PER_BATCH;
/// Emitted bytes per batch (the runtime's own default).
pub const MAX_EMIT_BYTES_PER_BATCH: u64 = crate::runtime::DEFAULT_MAX_EMIT_BYTES_PER_BATCH;
/// Per-request HTTP timeout, in ms.
pub const HTTP_TIMEOUT_MS: u64 = 5_000;
/// Largest HTTP response body handed to a plugin (1 MiB).
pub const HTTP_MAX_RESPONSE_BYTES: u64 = 1 << 20;
/// HTTP requests in flight at once per pipeline.
pub const HTTP_MAX_CONCURRENT: usize = 32;
