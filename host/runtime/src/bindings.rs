//! The bindings generated from the plugin contract, one set per contract version this host
//! speaks. Private to the crate, so the wire shape can change without touching the runtime's
//! public API. Of the exports only the types are used: calls into the guest go through typed
//! functions, so one runtime serves both contract versions. The imports' `Host` traits and
//! `add_to_linker` functions are what the capabilities implement and link (`outputs.rs`, and
//! `log.rs` for `types`; `log` itself is hand-wired for its bounded lift), so a change to an
//! import in the WIT is a compile error in the host.

/// Contract 0.2 (`wit/plugin.wit`): the types of every import and export, and the imports'
/// `Host` traits.
pub(crate) mod v02 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "sharehost:plugin/plugin",
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// Contract 0.1 (`wit/0.1.0/plugin.wit`), for its verdict type: four cases, no `retry`. A 0.1
/// component's `handle` result is checked against it; every other type of 0.1 is structurally
/// the same in 0.2.
pub(crate) mod v01 {
    wasmtime::component::bindgen!({
        path: "../../wit/0.1.0/plugin.wit",
        world: "sharehost:plugin/plugin",
        exports: { default: async },
    });
}
