//! `compile_bounds`: how long Cranelift takes to compile one generated function, against its
//! operator count, block nesting and locals; and the largest functions of real components.
//! The figures behind the `runtime.max_function_*` defaults (docs/reliability.md,
//! "Compilation bounded").
//!
//! ```text
//! cargo run --release -p sharehost-runtime --example compile_bounds -- SHAPE SIZE [LOCALS]
//! cargo run --release -p sharehost-runtime --example compile_bounds -- guests target/guests/*.wasm
//! ```
//!
//! SHAPE is one of `chain` (straight-line: `i64.const; i64.add` pairs on a running sum),
//! `stack` (SIZE/2 copies of the parameter pushed, then added), `deep` (SIZE/4 distinct
//! products pushed, then added: a deep operand stack of live values), `locals` (SIZE operators
//! reading and writing LOCALS locals), `block`, `loop`, `if` (SIZE nested blocks), `br_table`
//! (SIZE nested blocks and one `br_table` to all of them) and `loops` (SIZE loops one after
//! another, each updating one of LOCALS locals). Prints one line: the shape as the runtime
//! measures it, and the CPU seconds of the process for compiling it (with the engine settings
//! of the runtime: Cranelift at `speed`).

use std::time::Duration;

use anyhow::{Context, bail};
use sharehost_runtime::CodeShape;
use wasm_encoder::{
    BlockType, CodeSection, ExportKind, ExportSection, Function, FunctionSection, Instruction,
    Module, TypeSection, ValType,
};

fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A core module exporting one function `f: (i64) -> i64` of the given shape.
fn module(shape: &str, size: u32, locals: u32) -> anyhow::Result<Vec<u8>> {
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([ValType::I64], [ValType::I64]);
    m.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    m.section(&funcs);
    let mut exports = ExportSection::new();
    exports.export("f", ExportKind::Func, 0);
    m.section(&exports);
    let mut f = Function::new([(locals, ValType::I64)]);
    // A cheap pseudo-random local index, so that no pattern lets the compiler fold them.
    let pick = |i: u32, salt: u32| {
        1 + (i.wrapping_mul(2_654_435_761).wrapping_add(salt) >> 7) % locals.max(1)
    };
    match shape {
        "chain" => {
            f.instruction(&Instruction::LocalGet(0));
            for i in 0..size / 2 {
                f.instruction(&Instruction::I64Const(i64::from(i) * 0x1234_5678_9abc))
                    .instruction(&Instruction::I64Add);
            }
        }
        "deep" => {
            // Distinct values, all live on the operand stack until the adds at the end.
            for i in 0..size / 4 {
                f.instruction(&Instruction::LocalGet(0))
                    .instruction(&Instruction::I64Const(i64::from(i) * 0x1234_5678_9abc))
                    .instruction(&Instruction::I64Mul);
            }
            for _ in 1..size / 4 {
                f.instruction(&Instruction::I64Add);
            }
        }
        "stack" => {
            for _ in 0..size / 2 {
                f.instruction(&Instruction::LocalGet(0));
            }
            for _ in 1..size / 2 {
                f.instruction(&Instruction::I64Add);
            }
        }
        "locals" => {
            if locals == 0 {
                bail!("locals needs LOCALS");
            }
            for i in 0..size / 4 {
                f.instruction(&Instruction::LocalGet(pick(i, 1)))
                    .instruction(&Instruction::LocalGet(pick(i, 2)))
                    .instruction(&Instruction::I64Add)
                    .instruction(&Instruction::LocalGet(0))
                    .instruction(&Instruction::I64Xor)
                    .instruction(&Instruction::LocalSet(pick(i, 3)));
            }
            // Every local read at the end: each one's last value stays live.
            f.instruction(&Instruction::LocalGet(0));
            for l in 1..=locals {
                f.instruction(&Instruction::LocalGet(l))
                    .instruction(&Instruction::I64Add);
            }
        }
        "block" | "loop" | "if" => {
            for _ in 0..size {
                match shape {
                    "block" => f.instruction(&Instruction::Block(BlockType::Empty)),
                    "loop" => f.instruction(&Instruction::Loop(BlockType::Empty)),
                    _ => f
                        .instruction(&Instruction::LocalGet(0))
                        .instruction(&Instruction::I32WrapI64)
                        .instruction(&Instruction::If(BlockType::Empty)),
                };
            }
            for _ in 0..size {
                f.instruction(&Instruction::End);
            }
            f.instruction(&Instruction::LocalGet(0));
        }
        "br_table" => {
            for _ in 0..size {
                f.instruction(&Instruction::Block(BlockType::Empty));
            }
            f.instruction(&Instruction::LocalGet(0))
                .instruction(&Instruction::I32WrapI64)
                .instruction(&Instruction::BrTable((0..size).collect(), 0));
            for _ in 0..size {
                f.instruction(&Instruction::End);
            }
            f.instruction(&Instruction::LocalGet(0));
        }
        "loops" => {
            if locals == 0 {
                bail!("loops needs LOCALS");
            }
            for i in 0..size {
                f.instruction(&Instruction::Loop(BlockType::Empty))
                    .instruction(&Instruction::LocalGet(pick(i, 1)))
                    .instruction(&Instruction::LocalGet(0))
                    .instruction(&Instruction::I64Add)
                    .instruction(&Instruction::LocalSet(pick(i, 1)))
                    .instruction(&Instruction::LocalGet(0))
                    .instruction(&Instruction::I32WrapI64)
                    .instruction(&Instruction::BrIf(0))
                    .instruction(&Instruction::End);
            }
            // Every local read at the end: all of them live across every loop.
            f.instruction(&Instruction::LocalGet(0));
            for l in 1..=locals {
                f.instruction(&Instruction::LocalGet(l))
                    .instruction(&Instruction::I64Add);
            }
        }
        other => bail!("unknown shape {other}"),
    }
    f.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&f);
    m.section(&code);
    Ok(m.finish())
}

fn engine() -> anyhow::Result<wasmtime::Engine> {
    let mut c = wasmtime::Config::new();
    c.cranelift_opt_level(wasmtime::OptLevel::Speed)
        .epoch_interruption(true);
    Ok(wasmtime::Engine::new(&c)?)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (shape, rest) = args
        .split_first()
        .context("usage: SHAPE SIZE [LOCALS] | guests FILE...")?;
    if shape == "guests" {
        for path in rest {
            let bytes = std::fs::read(path).with_context(|| path.clone())?;
            let t = cpu();
            let s = CodeShape::measure(&bytes).map_err(anyhow::Error::msg)?;
            let walk = cpu() - t;
            println!(
                "{path} bytes={} modules={} functions={} max_operators={} ({}) max_nesting={} ({}) max_locals={} ({}) max_body_bytes={} ({}) max_loop_locals={} ({}) max_stack={} ({}) walk_cpu_ms={:.1}",
                bytes.len(),
                s.modules,
                s.functions,
                s.operators.0,
                s.operators.1,
                s.nesting.0,
                s.nesting.1,
                s.locals.0,
                s.locals.1,
                s.body_bytes.0,
                s.body_bytes.1,
                s.loop_locals.0,
                s.loop_locals.1,
                s.stack.0,
                s.stack.1,
                walk.as_secs_f64() * 1000.0
            );
        }
        return Ok(());
    }
    let size: u32 = rest.first().context("SIZE")?.parse()?;
    let locals: u32 = rest.get(1).map_or(Ok(0), |l| l.parse())?;
    let bytes = module(shape, size, locals)?;
    let s = CodeShape::measure(&bytes).map_err(anyhow::Error::msg)?;
    let engine = engine()?;
    let t = cpu();
    engine.precompile_module(&bytes)?;
    let spent = cpu() - t;
    println!(
        "shape={shape} size={size} operators={} nesting={} locals={} body_bytes={} compile_cpu_s={:.2}",
        s.operators.0,
        s.nesting.0,
        s.locals.0,
        s.body_bytes.0,
        spent.as_secs_f64()
    );
    Ok(())
}
