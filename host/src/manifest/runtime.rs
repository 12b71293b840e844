//! `[runtime]`: host-wide plugin runtime settings ([`RuntimeSpec`]), and their validator.

use super::context::Ctx;
use super::defaults;
use super::error::ManifestError;
use super::raw::RawRuntime;
use crate::runtime::FunctionBounds;

/// Host-wide plugin runtime settings (`[runtime]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSpec {
    /// The largest component file the host reads: a bound on what a path (in the manifest or
    /// a hot-swap request) can make the host read into memory.
    pub max_component_bytes: u64,
    /// What one function of a component may ask of the compiler (`max_function_operators`,
    /// `max_function_nesting`, `max_function_loop_locals`, `max_function_stack`): a bound on the CPU one load costs every host that compiles it.
    pub function_bounds: FunctionBounds,
}

/// The largest value each `max_function_*` key accepts: what WebAssembly's own limit lets
/// through anyway (a body of at most 7,654,321 bytes, as wasmtime validates, so at most as
/// many operators and nested blocks).
const MAX_FUNCTION_KEY: i64 = 8_000_000;

/// Validates `[runtime]` (absent: the defaults).
pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: Option<&RawRuntime>,
) -> Result<RuntimeSpec, ManifestError> {
    let Some(r) = raw else {
        return Ok(RuntimeSpec {
            max_component_bytes: defaults::MAX_COMPONENT_MIB << 20,
            function_bounds: FunctionBounds::default(),
        });
    };
    let max_component_mib: u64 = cx.int(
        &r.max_component_mib,
        "runtime.max_component_mib",
        1..=1024,
        defaults::MAX_COMPONENT_MIB,
    )?;
    let default = FunctionBounds::default();
    let function_bounds = FunctionBounds {
        max_operators: cx.int(
            &r.max_function_operators,
            "runtime.max_function_operators",
            1..=MAX_FUNCTION_KEY,
            default.max_operators,
        )?,
        max_nesting: cx.int(
            &r.max_function_nesting,
            "runtime.max_function_nesting",
            1..=MAX_FUNCTION_KEY,
            default.max_nesting,
        )?,
        // Loops times locals: at most 7.6 M loops times 50,000 locals.
        max_loop_locals: cx.int(
            &r.max_function_loop_locals,
            "runtime.max_function_loop_locals",
            1..=i64::MAX,
            default.max_loop_locals,
        )?,
        // A body of at most 7.6 M bytes holds at most as many values times 1,000 results.
        max_stack: cx.int(
            &r.max_function_stack,
            "runtime.max_function_stack",
            1..=i64::MAX,
            default.max_stack,
        )?,
    };
    Ok(RuntimeSpec {
        max_component_bytes: max_component_mib << 20,
        function_bounds,
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::testing::{MINIMAL, dir, parse};
    use crate::runtime::FunctionBounds;

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

    #[test]
    fn the_function_bounds_are_runtime_keys() {
        let m = parse(MINIMAL).expect("valid");
        assert_eq!(
            m.runtime_config().function_bounds,
            FunctionBounds::default()
        );
        let text = format!(
            "[runtime]\nmax_function_operators = 5000000\nmax_function_nesting = 20000\nmax_function_loop_locals = 7\nmax_function_stack = 9\n{MINIMAL}"
        );
        let bounds = parse(&text)
            .expect("valid")
            .runtime_config()
            .function_bounds;
        assert_eq!(
            bounds,
            FunctionBounds {
                max_operators: 5_000_000,
                max_nesting: 20_000,
                max_loop_locals: 7,
                max_stack: 9,
            }
        );
        for (key, bad) in [
            ("max_function_operators", 0),
            ("max_function_nesting", 8_000_001),
            ("max_function_loop_locals", 0),
        ] {
            let e = parse(&format!("[runtime]\n{key} = {bad}\n{MINIMAL}")).expect_err("range");
            assert_eq!(e.field.as_deref(), Some(format!("runtime.{key}").as_str()));
        }
    }
}
