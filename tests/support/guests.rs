//! Guest components built by `dev/build-guests`, new versions of them, and what the runtime
//! tests hand them (a plugin runtime, records).

use std::path::PathBuf;

use bytes::Bytes;

use crate::repo_root;

/// Path of a guest component built by `dev/build-guests` (name without `.wasm`); fails with
/// the fix when the guests were not built.
pub fn guest(name: &str) -> PathBuf {
    let path = repo_root()
        .join("target/guests")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "guest component {} is missing: run dev/build-guests first (dev/test does)",
        path.display()
    );
    path
}

/// The bytes of `component` with a custom section appended: the same plugin, another content
/// hash. A new version for a hot-swap, a canary or a rollback, and a file no earlier run has
/// cached.
pub fn new_version(component: &std::path::Path, tag: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(component).expect("read component");
    let name = b"sharehost-test-version";
    let payload = tag.as_bytes();
    let len = 1 + name.len() + payload.len();
    assert!(len < 128, "one-byte LEB128 sizes");
    bytes.push(0); // custom section
    bytes.push(u8::try_from(len).expect("small"));
    bytes.push(u8::try_from(name.len()).expect("small"));
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    bytes
}

/// A plugin runtime for the runtime tests: 64 MiB plugins, 8 instances in the pool.
pub fn plugin_runtime() -> sharehost::runtime::PluginRuntime {
    sharehost::runtime::PluginRuntime::new(sharehost::runtime::RuntimeConfig {
        max_plugin_memory: 64 << 20,
        max_instances: 8,
        ..sharehost::runtime::RuntimeConfig::default()
    })
    .expect("runtime")
}

/// A record as a plugin judges it (topic `orders`, partition 3, first delivery, key `k{offset}`)
/// with `value` and `headers`: what the runtime tests hand to fixtures.
pub fn plugin_record(
    offset: i64,
    value: &str,
    headers: &[(&str, &str)],
) -> sharehost::runtime::Record {
    sharehost::runtime::Record {
        topic: std::sync::Arc::from("orders"),
        partition: 3,
        offset,
        timestamp: 1_700_000_000_000 + offset,
        delivery_count: 1,
        key: Some(Bytes::from(format!("k{offset}"))),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: headers
            .iter()
            .map(|(k, v)| sharehost::runtime::Header {
                key: (*k).to_owned(),
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
            })
            .collect(),
    }
}
