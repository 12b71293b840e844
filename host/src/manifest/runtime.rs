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
