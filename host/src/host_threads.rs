//! The host's own threads: the async runtime that runs the share engine, the pipelines'
//! bookkeeping and the admin API, beside the guests' threads of their own.

/// The runtime of the host's own work, with [`host_threads`] workers: what `sharehost` runs on,
/// and what the native benchmark twin runs on, so the two differ only in the handler.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(host_threads(
            std::env::var("TOKIO_WORKER_THREADS").ok().as_deref(),
            std::thread::available_parallelism().map_or(2, |n| n.get()),
        ))
        .enable_all()
        .build()
}

/// How many threads the host's own work gets: half the cores, rounded up. Guests run on threads
/// of their own, one per core, so the host's half is what it has beside busy guests; a host
/// thread per core as well only passed each batch between cores (on 2 cores beside the broker,
/// one host thread instead of two cut the host's CPU per record by about a tenth and ran as
/// fast or faster, with a light plugin and a heavy one). tokio's own `TOKIO_WORKER_THREADS`,
/// when set to a count, decides instead.
fn host_threads(env: Option<&str>, cores: usize) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(cores.div_ceil(2))
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::host_threads;

    #[test]
    fn the_host_takes_half_the_cores_unless_tokio_is_told_otherwise() {
        assert_eq!(host_threads(None, 1), 1);
        assert_eq!(host_threads(None, 2), 1);
        assert_eq!(host_threads(None, 3), 2);
        assert_eq!(host_threads(None, 16), 8);
        assert_eq!(host_threads(Some("4"), 2), 4);
        // Not a count: the default.
        for bad in ["", "0", "-1", "many"] {
            assert_eq!(host_threads(Some(bad), 8), 4, "{bad:?}");
        }
    }
}
