//! Bounds on what one function may ask of the compiler, checked from the component's code
//! section before Cranelift sees it.
//!
//! Cranelift compiles each function on one thread, and its time grows faster than the
//! function: 16,000 nested loops took 23 s of CPU, 4,000 loops over 1,000 live locals 20 s,
//! 80,000 values held on the operand stack 19 s (docs/reliability.md, "Compilation
//! bounded"), and the file size cap lets through functions far larger. Every host that loads a component
//! (`check`, `test-plugin`, a swap, each host of a fleet) would pay that. So a load walks
//! every function body of every core module (a linear read, no compilation) and refuses a
//! function over a bound, naming the function, what it has, the bound and the manifest key
//! that raises it. The defaults are several times the largest function of the real guests
//! (the Python interpreter's) and below where compile time runs away.

use std::path::Path;

use wasmparser::{
    Encoding, FuncValidator, Operator, Parser, Payload, TypeRef, ValidPayload, Validator,
    ValidatorResources, WasmFeatures,
};

use crate::error::LoadError;

/// Operators one function body may have by default (manifest `runtime.max_function_operators`):
/// about three times the largest real one (the Python interpreter's loop, 166,865), where a
/// straight-line function takes about half a minute of CPU to compile.
pub const DEFAULT_MAX_FUNCTION_OPERATORS: u64 = 500_000;
/// Blocks (`block`, `loop`, `if`, `try_table`) one function may nest by default (manifest
/// `runtime.max_function_nesting`): five times the deepest real function (781, Python),
/// where 4,000 nested loops take under two seconds to compile (16,000 took 23 s).
pub const DEFAULT_MAX_FUNCTION_NESTING: u64 = 4_000;
/// Loops times declared locals one function may have by default (manifest
/// `runtime.max_function_loop_locals`): each loop header is a merge point where every local
/// live across it becomes an SSA value of its own, and 4,000 loops over 1,000 live locals
/// (38,000 operators) took 20 s to compile. See docs/reliability.md for the guests' figure.
pub const DEFAULT_MAX_FUNCTION_LOOP_LOCALS: u64 = 400_000;
/// Values one function may hold on its operand stack at once by default (manifest
/// `runtime.max_function_stack`): every value held is live across what follows, and register
/// allocation over many live values grows quadratically (80,000 operators holding half of them
/// took 19 s). Far above the real guests' deepest stacks (see docs/reliability.md).
pub const DEFAULT_MAX_FUNCTION_STACK: u64 = 2_000;

/// The most results a function type may have (wasmparser's limit, which wasmtime keeps).
const MAX_RESULTS: u64 = 1_000;

/// The bounds one function must keep to be compiled: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionBounds {
    /// Operators in one function body.
    pub max_operators: u64,
    /// Depth of nested blocks in one function.
    pub max_nesting: u64,
    /// Loops times declared locals in one function.
    pub max_loop_locals: u64,
    /// Values on one function's operand stack at once.
    pub max_stack: u64,
}

impl Default for FunctionBounds {
    fn default() -> Self {
        Self {
            max_operators: DEFAULT_MAX_FUNCTION_OPERATORS,
            max_nesting: DEFAULT_MAX_FUNCTION_NESTING,
            max_loop_locals: DEFAULT_MAX_FUNCTION_LOOP_LOCALS,
            max_stack: DEFAULT_MAX_FUNCTION_STACK,
        }
    }
}

/// Where a function is in a component: its core module (counted from 0 in the order the
/// component's bytes hold them, nested components included) and its index in that module's
/// function index space (imported functions first, as `wasm-tools print` and wasmtime's
/// traces number them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionAt {
    /// The core module's position in the component.
    pub module: u32,
    /// The function's index in its module.
    pub function: u32,
}

impl std::fmt::Display for FunctionAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "function {} of core module {}",
            self.function, self.module
        )
    }
}

/// The largest of each measure over every function of a component, with the function that
/// has it: what the bounds are checked against, and what the benchmark prints for the real
/// guests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeShape {
    /// Core modules in the component.
    pub modules: u32,
    /// Function bodies in all of them.
    pub functions: u64,
    /// The most operators in one body.
    pub operators: (u64, FunctionAt),
    /// The deepest block nesting in one body.
    pub nesting: (u64, FunctionAt),
    /// The most locals one body declares (not bounded: compile time grows with them no
    /// faster than with the operators that use them, and WebAssembly caps them at 50,000).
    pub locals: (u64, FunctionAt),
    /// The largest body, in bytes.
    pub body_bytes: (u64, FunctionAt),
    /// The largest product of loops and declared locals in one body.
    pub loop_locals: (u64, FunctionAt),
    /// The highest operand stack in one body (of the bodies whose operators were read).
    pub stack: (u64, FunctionAt),
}

impl CodeShape {
    /// Walks every function body of every core module in `bytes` (a component or a core
    /// module). Reads operators without validating them: an invalid body that gets past
    /// this walk is refused by wasmtime's validation afterwards. An error is the parser's
    /// message (positions, never bytes).
    pub fn measure(bytes: &[u8]) -> Result<CodeShape, String> {
        Self::measure_beyond(bytes, 0, 0, 0)
    }

    /// [`CodeShape::measure`], reading the operators only of bodies longer than `small`
    /// bytes or whose length times their locals is over `loop_locals`: every operator takes
    /// at least a byte, so a shorter body has at most `small` operators, nested blocks and
    /// loops, and need not be read to be checked against bounds of `small` or more (its
    /// figures stay 0). Most functions are short: this keeps the walk of a 19 MB Python
    /// component to its few large functions.
    ///
    /// The operand stack's height needs every operator's type, so the walk runs wasmparser's
    /// validator beside it (module and component sections, and the bodies it reads), with
    /// every feature on: it accepts all that wasmtime's validation (the same wasmparser, fewer
    /// features) accepts, so what it refuses wasmtime would refuse too.
    fn measure_beyond(
        bytes: &[u8],
        small: u64,
        loop_locals: u64,
        stack: u64,
    ) -> Result<CodeShape, String> {
        let mut shape = CodeShape::default();
        let mut validator = Validator::new_with_features(WasmFeatures::all());
        // The most values one operator of the module being read may push: a call pushes its
        // callee's results (up to 1,000 each), any other operator one or two.
        let mut pushes = 2u64;
        // The module being read, and the index its next defined function gets.
        let mut at = FunctionAt::default();
        for payload in Parser::new(0).parse_all(bytes) {
            let payload = payload.map_err(|e| e.to_string())?;
            let valid = validator.payload(&payload).map_err(|e| e.to_string())?;
            match payload {
                Payload::Version {
                    encoding: Encoding::Module,
                    ..
                } => {
                    at = FunctionAt {
                        module: shape.modules,
                        function: 0,
                    };
                    shape.modules = shape.modules.saturating_add(1);
                    pushes = 2;
                }
                Payload::TypeSection(reader) => {
                    for ty in reader.into_iter_err_on_gc_types() {
                        // A GC type (refused here, not by the validator): count it at the most.
                        let results = ty.map_or(MAX_RESULTS, |t| t.results().len() as u64);
                        pushes = pushes.max(results);
                    }
                }
                Payload::ImportSection(reader) => {
                    for import in reader.into_imports() {
                        let import = import.map_err(|e| e.to_string())?;
                        if matches!(import.ty, TypeRef::Func(_) | TypeRef::FuncExact(_)) {
                            at.function = at.function.saturating_add(1);
                        }
                    }
                }
                Payload::CodeSectionEntry(body) => {
                    let func = match valid {
                        ValidPayload::Func(func, _) => Some(func),
                        _ => None,
                    };
                    let one = measure_body(&body, small, loop_locals, stack / pushes, |v| {
                        func.map(|f| f.into_validator(Default::default()))
                            .filter(|_| v)
                    })
                    .map_err(|e| e.to_string())?;
                    shape.functions = shape.functions.saturating_add(1);
                    for (most, has) in [
                        (&mut shape.operators, one.operators),
                        (&mut shape.nesting, one.nesting),
                        (&mut shape.locals, one.locals),
                        (&mut shape.body_bytes, one.body_bytes),
                        (&mut shape.loop_locals, one.loops.saturating_mul(one.locals)),
                        (&mut shape.stack, one.stack),
                    ] {
                        if has > most.0 {
                            *most = (has, at);
                        }
                    }
                    at.function = at.function.saturating_add(1);
                }
                _ => {}
            }
        }
        Ok(shape)
    }

    /// Walks `bytes` and checks every function against `bounds` (see the module doc).
    pub(crate) fn check_bytes(
        path: &Path,
        bytes: &[u8],
        bounds: &FunctionBounds,
    ) -> Result<(), LoadError> {
        let small = bounds.max_operators.min(bounds.max_nesting);
        Self::measure_beyond(bytes, small, bounds.max_loop_locals, bounds.max_stack)
            .map_err(|message| LoadError::Compile {
                path: path.to_owned(),
                message,
            })?
            .check(path, bounds)
    }

    /// The first bound this shape breaks (operators, nesting, then loops times locals), as the load error that
    /// names the function, what it has, the bound and the key raising it.
    pub(crate) fn check(&self, path: &Path, bounds: &FunctionBounds) -> Result<(), LoadError> {
        let over = [
            (
                self.operators,
                bounds.max_operators,
                "operators",
                "runtime.max_function_operators",
            ),
            (
                self.nesting,
                bounds.max_nesting,
                "nested blocks",
                "runtime.max_function_nesting",
            ),
            (
                self.loop_locals,
                bounds.max_loop_locals,
                "loops × locals",
                "runtime.max_function_loop_locals",
            ),
            (
                self.stack,
                bounds.max_stack,
                "values on its operand stack",
                "runtime.max_function_stack",
            ),
        ]
        .into_iter()
        .find(|((has, _), bound, _, _)| has > bound);
        match over {
            Some(((has, at), bound, what, key)) => Err(LoadError::FunctionTooLarge {
                path: path.to_owned(),
                at,
                what,
                has,
                bound,
                key,
            }),
            None => Ok(()),
        }
    }
}

/// What one function body has.
struct BodyShape {
    operators: u64,
    loops: u64,
    nesting: u64,
    locals: u64,
    body_bytes: u64,
    stack: u64,
}

/// Measures one body; its operators only when it is longer than `small` bytes or its length
/// times its locals is over `loop_locals` (see [`CodeShape::measure_beyond`]).
/// `validator(true)` gives the body's validator when its operators are read; they are read
/// too when the body is longer than `stack_bytes` (each operator is at least a byte, and
/// pushes at most `max_stack / stack_bytes` values, so a shorter body stays under the stack
/// bound).
fn measure_body(
    body: &wasmparser::FunctionBody<'_>,
    small: u64,
    loop_locals: u64,
    stack_bytes: u64,
    validator: impl FnOnce(bool) -> Option<FuncValidator<ValidatorResources>>,
) -> wasmparser::Result<BodyShape> {
    let mut locals = 0u64;
    for group in body.get_locals_reader()? {
        let (count, _) = group?;
        locals = locals.saturating_add(u64::from(count));
    }
    let body_bytes = body.range().len() as u64;
    let (mut operators, mut depth, mut nesting, mut loops) = (0u64, 0u64, 0u64, 0u64);
    let mut stack = 0u64;
    let read = !(body_bytes <= small
        && body_bytes.saturating_mul(locals) <= loop_locals
        && body_bytes <= stack_bytes);
    let mut validator = validator(read);
    if !read {
        return Ok(BodyShape {
            operators,
            loops,
            nesting,
            locals,
            body_bytes,
            stack,
        });
    }
    if let Some(v) = validator.as_mut() {
        v.read_locals(&mut body.get_binary_reader())?;
    }
    let mut reader = body.get_operators_reader()?;
    while !reader.eof() {
        let offset = reader.original_position();
        let op = reader.read()?;
        if let Some(v) = validator.as_mut() {
            v.op(offset, &op)?;
            stack = stack.max(u64::from(v.operand_stack_height()));
        }
        if matches!(op, Operator::Loop { .. }) {
            loops += 1;
        }
        match op {
            Operator::Block { .. }
            | Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::TryTable { .. }
            | Operator::Try { .. } => {
                depth += 1;
                nesting = nesting.max(depth);
            }
            // The body's own closing `end` takes the depth below zero: not a block of its own.
            Operator::End => depth = depth.saturating_sub(1),
            _ => {}
        }
        operators += 1;
    }
    Ok(BodyShape {
        operators,
        loops,
        nesting,
        locals,
        body_bytes,
        stack,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        BlockType, CodeSection, Function, FunctionSection, ImportSection, Instruction, Module,
        TypeSection, ValType,
    };

    /// A core module importing one function, then defining an empty one and one whose body
    /// nests `depth` blocks (loops and ifs among them) around `ops` constants dropped.
    fn module(depth: u32, ops: u32, locals: u32) -> Vec<u8> {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import("env", "g", wasm_encoder::EntityType::Function(0));
        m.section(&imports);
        let mut funcs = FunctionSection::new();
        funcs.function(0).function(0);
        m.section(&funcs);
        let mut code = CodeSection::new();
        let mut empty = Function::new([]);
        empty.instruction(&Instruction::End);
        code.function(&empty);
        let mut f = Function::new([(locals, ValType::I64)]);
        for i in 0..depth {
            match i % 3 {
                0 => f.instruction(&Instruction::Block(BlockType::Empty)),
                1 => f.instruction(&Instruction::Loop(BlockType::Empty)),
                _ => f
                    .instruction(&Instruction::I32Const(1))
                    .instruction(&Instruction::If(BlockType::Empty)),
            };
        }
        for _ in 0..ops {
            f.instruction(&Instruction::I64Const(7))
                .instruction(&Instruction::Drop);
        }
        for _ in 0..depth {
            f.instruction(&Instruction::End);
        }
        f.instruction(&Instruction::End);
        code.function(&f);
        m.section(&code);
        m.finish()
    }

    #[test]
    fn nesting_is_the_deepest_block_and_names_the_function() {
        let shape = CodeShape::measure(&module(1001, 0, 0)).expect("parses");
        // Function 0 is the import, 1 the empty body, 2 the deep one.
        let at = FunctionAt {
            module: 0,
            function: 2,
        };
        assert_eq!(shape.nesting, (1001, at));
        assert_eq!(shape.functions, 2);
        let bounds = FunctionBounds {
            max_nesting: 1000,
            ..FunctionBounds::default()
        };
        let e = shape
            .check(Path::new("deep.wasm"), &bounds)
            .expect_err("1001 nested blocks over a bound of 1000");
        assert_eq!(
            e.to_string(),
            "deep.wasm: function 2 of core module 0 has 1001 nested blocks, more than the \
             maximum of 1000 (raise runtime.max_function_nesting in the manifest)"
        );
        // At the bound, and under a raised one, it passes.
        let shape = CodeShape::measure(&module(1000, 0, 0)).expect("parses");
        assert_eq!(shape.nesting.0, 1000);
        shape
            .check(Path::new("deep.wasm"), &bounds)
            .expect("at the bound");
        let raised = FunctionBounds {
            max_nesting: 2000,
            ..FunctionBounds::default()
        };
        CodeShape::measure(&module(1001, 0, 0))
            .expect("parses")
            .check(Path::new("deep.wasm"), &raised)
            .expect("under a raised bound");
    }

    #[test]
    fn operators_and_locals_are_counted_per_function() {
        let shape = CodeShape::measure(&module(3, 10, 7)).expect("parses");
        // 3 blocks (one `if` after its condition), 10 constants and drops, 3 + 1 ends.
        assert_eq!(shape.operators.0, 3 + 1 + 20 + 4);
        assert_eq!(shape.locals.0, 7);
        let bounds = FunctionBounds {
            max_operators: 27,
            ..FunctionBounds::default()
        };
        let e = shape
            .check(Path::new("big.wasm"), &bounds)
            .expect_err("28 operators over 27");
        assert!(
            e.to_string().contains(
                "has 28 operators, more than the maximum of 27 (raise runtime.max_function_operators"
            ),
            "{e}"
        );
        // The default bounds: 4,001 nested blocks are refused by them.
        let e = CodeShape::measure(&module(4001, 0, 0))
            .expect("parses")
            .check(Path::new("deep.wasm"), &FunctionBounds::default())
            .expect_err("over the default nesting");
        assert!(
            e.to_string()
                .contains("has 4001 nested blocks, more than the maximum of 4000"),
            "{e}"
        );
    }

    #[test]
    fn loops_times_locals_is_bounded() {
        // 12 blocks, a third of them loops, and 500 locals: 4 × 500 = 2,000.
        let shape = CodeShape::measure(&module(12, 0, 500)).expect("parses");
        assert_eq!(shape.loop_locals.0, 2_000);
        let bounds = FunctionBounds {
            max_loop_locals: 1_999,
            ..FunctionBounds::default()
        };
        let e = shape.check(Path::new("l.wasm"), &bounds).expect_err("over");
        assert!(
            e.to_string().contains(
                "has 2000 loops × locals, more than the maximum of 1999 (raise runtime.max_function_loop_locals"
            ),
            "{e}"
        );
        // The same through the shortened walk of a load.
        let e = CodeShape::check_bytes(Path::new("l.wasm"), &module(12, 0, 500), &bounds)
            .expect_err("over");
        assert!(e.to_string().contains("has 2000 loops × locals"), "{e}");
    }

    /// A core module whose one function pushes `held` constants, then drops them all.
    fn held(held: u32) -> Vec<u8> {
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        m.section(&types);
        let mut funcs = FunctionSection::new();
        funcs.function(0);
        m.section(&funcs);
        let mut code = CodeSection::new();
        let mut f = Function::new([]);
        for _ in 0..held {
            f.instruction(&Instruction::I64Const(1));
        }
        for _ in 0..held {
            f.instruction(&Instruction::Drop);
        }
        f.instruction(&Instruction::End);
        code.function(&f);
        m.section(&code);
        m.finish()
    }

    #[test]
    fn values_held_on_the_operand_stack_are_bounded() {
        let shape = CodeShape::measure(&held(2_001)).expect("parses");
        assert_eq!(shape.stack.0, 2_001);
        let e = CodeShape::check_bytes(
            Path::new("s.wasm"),
            &held(2_001),
            &FunctionBounds::default(),
        )
        .expect_err("over the default stack bound");
        assert!(
            e.to_string().contains(
                "function 0 of core module 0 has 2001 values on its operand stack, more than the maximum of 2000 (raise runtime.max_function_stack"
            ),
            "{e}"
        );
        CodeShape::check_bytes(
            Path::new("s.wasm"),
            &held(2_000),
            &FunctionBounds::default(),
        )
        .expect("at the bound");
        // A body shorter than the operator and nesting bounds' walk reads (3,601 bytes) is
        // read for its stack all the same.
        let bounds = FunctionBounds {
            max_stack: 1_000,
            ..FunctionBounds::default()
        };
        let e = CodeShape::check_bytes(Path::new("s.wasm"), &held(1_200), &bounds)
            .expect_err("over a stack bound of 1,000");
        assert!(
            e.to_string()
                .contains("has 1200 values on its operand stack"),
            "{e}"
        );
    }

    #[test]
    fn garbage_in_a_code_section_is_an_error_not_a_panic() {
        let mut bytes = module(2, 2, 1);
        let n = bytes.len();
        bytes.truncate(n - 3);
        assert!(CodeShape::measure(&bytes).is_err());
    }
}
