//! `[runtime]`: host-wide plugin runtime settings ([`RuntimeSpec`]), and their validator.

use super::context::Ctx;
use super::defaults;
use super::error::ManifestError;
use super::raw::RawRuntime;

/// Host-wide plugin runtime settings (`[runtime]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSpec {
    /// The largest component file the host reads: a bound on what a path (in the manifest or
    /// a hot-swap request) can make the host read into memory.
    pub max_component_bytes: u64,
}

/// Validates `[runtime]` (absent: the defaults).
pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<&RawRuntime>,
) -> Result<RuntimeSpec, ManifestError> {
    let max_component_mib: u64 = match raw {
        Some(r) => cx.int(
            &r.max_component_mib,
            "runtime.max_component_mib",
            1..=1024,
            defaults::MAX_COMPONENT_MIB,
        )?,
        None => defaults::MAX_COMPONENT_MIB,
    };
    Ok(RuntimeSpec {
        max_component_bytes: max_component_mib << 20,
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::testing::{MINIMAL, dir, parse};

    #[test]
    fn the_component_size_limit_is_a_runtime_key() {
        let m = parse(MINIMAL).expect("valid");
        assert_eq!(m.runtime.max_component_bytes, 64 << 20);
        assert_eq!(m.runtime_config().max_component_bytes, 64 << 20);
        let text = format!("[runtime]\nmax_component_mib = 2\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        assert_eq!(m.runtime_config().max_component_bytes, 2 << 20);
        // A component file over the maximum is refused by the manifest check, naming the key.
        let big = dir().join("big.wasm");
        std::fs::File::create(&big)
            .expect("create")
            .set_len(3 << 20)
            .expect("grow");
        let e = parse(&text.replace("plugin.wasm", "big.wasm")).expect_err("too big");
        assert!(
            e.message
                .contains("is 3 MiB, more than the 2 MiB maximum (runtime.max_component_mib"),
            "{e}"
        );
        let e = parse(&format!("[runtime]\nmax_component_mib = 0\n{MINIMAL}")).expect_err("0");
        assert_eq!(e.field.as_deref(), Some("runtime.max_component_mib"));
    }
}
