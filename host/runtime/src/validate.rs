//! Load-time checks: a component must export the plugin world and import nothing beyond
//! what the runtime grants. Both run before anything is instantiated, so a refused plugin
//! never executes a single instruction: once on the names read from the component's sections
//! before compiling ([`check_contract`]), and again on the compiled types ([`check_compiled`]).

use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use crate::error::LoadError;

/// The host interface every plugin may import (any 0.1.x or 0.2.x patch version).
pub const HOST_INTERFACE: &str = "sharehost:plugin/host";

/// The type-only interface of the contract; a component imports it when it uses the types.
const TYPES_INTERFACE: &str = "sharehost:plugin/types";

/// The outputs interface (contract 0.2 only): `emit`.
const OUTPUTS_INTERFACE: &str = "sharehost:plugin/outputs";

/// The WASI HTTP interfaces a plugin imports to call out (0.2.x), granted only when its
/// pipeline lists hosts in `allowed_outbound_hosts`.
pub const HTTP_INTERFACES: &[&str] = &["wasi:http/outgoing-handler", "wasi:http/types"];

/// The contract versions (minor, for 0.x) this host speaks.
fn speaks(version: &str) -> bool {
    version.starts_with("0.1.") || version.starts_with("0.2.")
}

/// The WASI 0.2 interfaces a plugin may import, without version. Rust's standard library on
/// `wasm32-wasip2` (and other component toolchains) imports these even when the plugin
/// never calls them; they are served from an empty context: no environment, no arguments,
/// stdin closed, stdout/stderr captured and bounded, real clocks and random numbers.
/// Everything else (notably `wasi:filesystem`, `wasi:sockets`, `wasi:http`) is refused.
pub const ALLOWED_WASI_INTERFACES: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// The exports of the plugin world. Their types are checked by the generated bindings.
const REQUIRED_EXPORTS: &[&str] = &["init", "handle"];

/// Whether one import name (e.g. `wasi:io/streams@0.2.6`) is granted; `http` says whether
/// the pipeline grants outbound HTTP.
fn import_allowed(name: &str, http: bool) -> bool {
    let (interface, version) = match name.split_once('@') {
        Some((i, v)) => (i, Some(v)),
        None => (name, None),
    };
    if interface == HOST_INTERFACE || interface == TYPES_INTERFACE {
        return version.is_some_and(speaks);
    }
    if interface == OUTPUTS_INTERFACE {
        return version.is_some_and(|v| v.starts_with("0.2."));
    }
    let wasi_02 = version.is_some_and(|v| v.starts_with("0.2."));
    if HTTP_INTERFACES.contains(&interface) {
        return http && wasi_02;
    }
    ALLOWED_WASI_INTERFACES.contains(&interface) && wasi_02
}

/// Whether an import name is one of the WASI HTTP interfaces (0.2.x) a grant would allow.
fn is_http_import(name: &str) -> bool {
    name.split_once('@')
        .is_some_and(|(i, v)| HTTP_INTERFACES.contains(&i) && v.starts_with("0.2."))
}

/// The package every contract interface belongs to.
const PACKAGE: &str = "sharehost:plugin/";

/// The `sharehost:plugin` version a contract import or export name carries when it is not one
/// this host speaks (0.1.x, 0.2.x), e.g. `0.3.0` for `sharehost:plugin/host@0.3.0`. Such a
/// component was built against another contract; calling that a forbidden import would send
/// its author looking in the wrong place.
fn foreign_version<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    names.into_iter().find_map(|name| {
        let rest = name.strip_prefix(PACKAGE)?;
        match rest.split_once('@') {
            Some((_, v)) if speaks(v) => None,
            Some((_, v)) => Some(v.to_owned()),
            None => Some("(unversioned)".to_owned()),
        }
    })
}

/// Names the first missing or non-function export of the plugin world in a component's
/// top-level exports (`(name, is a function)`), read before compiling.
fn missing_exports_in<'a>(
    exports: impl IntoIterator<Item = (&'a str, bool)> + Clone,
) -> Option<String> {
    let problems: Vec<String> = REQUIRED_EXPORTS
        .iter()
        .filter_map(
            |name| match exports.clone().into_iter().find(|(n, _)| n == name) {
                Some((_, true)) => None,
                Some((_, false)) => Some(format!("export `{name}` is not a function")),
                None => Some(format!("missing export `{name}`")),
            },
        )
        .collect();
    if problems.is_empty() {
        None
    } else {
        Some(problems.join(", "))
    }
}

/// The top-level import and export names of a compiled component (for a cached one, whose
/// bytes were not parsed this time).
fn names(engine: &Engine, component: &Component) -> Vec<String> {
    let ty = component.component_type();
    ty.imports(engine)
        .map(|(n, _)| n.to_owned())
        .chain(ty.exports(engine).map(|(n, _)| n.to_owned()))
        .collect()
}

/// Every import name of `component`, in the component's order.
fn imports(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// Names the first missing or non-function export of the plugin world, if any.
fn missing_exports(engine: &Engine, component: &Component) -> Option<String> {
    let ty = component.component_type();
    let mut problems = Vec::new();
    for name in REQUIRED_EXPORTS {
        match ty.get_export(engine, name).map(|e| e.ty) {
            Some(ComponentItem::ComponentFunc(_)) => {}
            Some(_) => problems.push(format!("export `{name}` is not a function")),
            None => problems.push(format!("missing export `{name}`")),
        }
    }
    if problems.is_empty() {
        None
    } else {
        Some(problems.join(", "))
    }
}

/// Refuses a component whose top-level names break the contract, in the order that tells its
/// author the most: another package version first (every other complaint follows from it),
/// then imports not granted, then a missing or non-function `init`/`handle`.
pub(crate) fn check_contract<'a>(
    path: &Path,
    http: bool,
    imports: impl Iterator<Item = &'a str> + Clone,
    exports: impl Iterator<Item = (&'a str, bool)> + Clone,
) -> Result<(), LoadError> {
    if let Some(found) = foreign_version(imports.clone().chain(exports.clone().map(|(n, _)| n))) {
        return Err(LoadError::WrongVersion {
            path: path.to_owned(),
            found,
        });
    }
    check_imports(path, http, imports)?;
    if let Some(message) = missing_exports_in(exports) {
        return Err(LoadError::WrongWorld {
            path: path.to_owned(),
            message,
        });
    }
    Ok(())
}

/// Refuses imports that are not granted: outbound HTTP without a grant with its own error
/// (naming the manifest key that grants it), anything else as forbidden.
fn check_imports<'a>(
    path: &Path,
    http: bool,
    imports: impl Iterator<Item = &'a str>,
) -> Result<(), LoadError> {
    let forbidden: Vec<&str> = imports.filter(|n| !import_allowed(n, http)).collect();
    if forbidden.is_empty() {
        return Ok(());
    }
    if forbidden.iter().all(|n| is_http_import(n)) {
        return Err(LoadError::HttpNotGranted {
            path: path.to_owned(),
            imports: forbidden.iter().map(|n| (*n).to_owned()).collect(),
        });
    }
    Err(LoadError::ForbiddenImport {
        path: path.to_owned(),
        imports: forbidden.iter().map(|n| (*n).to_owned()).collect(),
    })
}

/// The same checks on a compiled component's types: they also cover a cached entry (whose
/// bytes were not parsed this time) and export types the section walk does not look at.
pub(crate) fn check_compiled(
    path: &Path,
    http: bool,
    component: &Component,
) -> Result<(), LoadError> {
    let engine = component.engine();
    if let Some(found) = foreign_version(names(engine, component).iter().map(String::as_str)) {
        return Err(LoadError::WrongVersion {
            path: path.to_owned(),
            found,
        });
    }
    let imported = imports(engine, component);
    check_imports(path, http, imported.iter().map(String::as_str))?;
    if let Some(message) = missing_exports(engine, component) {
        return Err(LoadError::WrongWorld {
            path: path.to_owned(),
            message,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{foreign_version, import_allowed, is_http_import, missing_exports_in};

    #[test]
    fn another_package_version_is_named() {
        assert_eq!(
            foreign_version(["wasi:io/streams@0.2.6", "sharehost:plugin/host@0.3.0"]),
            Some("0.3.0".to_owned())
        );
        assert_eq!(
            foreign_version([
                "sharehost:plugin/outputs@0.2.0",
                "sharehost:plugin/host@0.2.1"
            ]),
            None
        );
        assert_eq!(
            foreign_version(["sharehost:plugin/types@1.0.0"]),
            Some("1.0.0".to_owned())
        );
        assert_eq!(
            foreign_version(["sharehost:plugin/host@0.1.3", "wasi:http/handler@0.2.0"]),
            None
        );
    }

    #[test]
    fn plugin_world_exports_are_checked_by_name_and_kind() {
        assert_eq!(missing_exports_in([("init", true), ("handle", true)]), None);
        assert_eq!(
            missing_exports_in([("init", true), ("handle", false)]).as_deref(),
            Some("export `handle` is not a function")
        );
        assert_eq!(
            missing_exports_in([("init", true)]).as_deref(),
            Some("missing export `handle`")
        );
    }

    #[test]
    fn minimal_wasi_set_and_host_interface_are_granted() {
        assert!(import_allowed("wasi:io/streams@0.2.6", false));
        assert!(import_allowed("wasi:cli/stderr@0.2.0", false));
        assert!(import_allowed("sharehost:plugin/host@0.1.0", false));
        assert!(import_allowed("sharehost:plugin/types@0.1.3", false));
        assert!(import_allowed("sharehost:plugin/host@0.2.0", false));
        assert!(import_allowed("sharehost:plugin/outputs@0.2.0", false));
        assert!(!import_allowed("sharehost:plugin/outputs@0.1.0", false));
    }

    #[test]
    fn wasi_http_is_granted_only_with_allowed_hosts() {
        assert!(!import_allowed("wasi:http/outgoing-handler@0.2.6", false));
        assert!(!import_allowed("wasi:http/types@0.2.6", false));
        assert!(import_allowed("wasi:http/outgoing-handler@0.2.6", true));
        assert!(import_allowed("wasi:http/types@0.2.0", true));
        // Never WASI 0.3's handler, nor the incoming side, whatever the grant.
        assert!(!import_allowed("wasi:http/handler@0.3.0", true));
        assert!(!import_allowed("wasi:http/incoming-handler@0.2.6", true));
        assert!(is_http_import("wasi:http/outgoing-handler@0.2.6"));
        assert!(!is_http_import("wasi:http/handler@0.3.0"));
    }

    #[test]
    fn filesystem_sockets_http_and_other_versions_are_refused() {
        for http in [false, true] {
            assert!(!import_allowed("wasi:filesystem/types@0.2.6", http));
            assert!(!import_allowed("wasi:filesystem/preopens@0.2.6", http));
            assert!(!import_allowed("wasi:sockets/tcp@0.2.6", http));
            assert!(!import_allowed("sharehost:plugin/host@0.3.0", http));
            assert!(!import_allowed("wasi:io/streams@0.3.0", http));
            assert!(!import_allowed("wasi:io/streams", http));
            assert!(!import_allowed("evil", http));
        }
    }
}
