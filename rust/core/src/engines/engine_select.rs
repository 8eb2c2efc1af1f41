//! Which ALU operators each engine's `tensor_scalar` / `tensor_tensor` accepts (reference §2.2,
//! §2.6). The default-engine rule is an ISA fact (`isa::default_engine`), re-exported here.

use crate::error::{err, ErrorKind::*, Result};
use crate::isa::tables::p::tensor_scalar as ts;
use crate::isa::{AluOp, Arg, Engine, Instr, Opcode};

fn alu(args: &[Arg], i: usize) -> Option<AluOp> {
    match args.get(i) {
        Some(Arg::Enum(v)) => AluOp::from_u8(*v),
        _ => None,
    }
}

pub use crate::isa::default_engine::default_engine;

/// Operators that exist only on some engines: `rsqrt` on GpSimd/ScalarE, `reciprocal` on
/// VectorE/ScalarE (reference §2.2).
pub fn check_engine_ops(ins: &Instr) -> Result<()> {
    let ops: &[(usize, &str)] = match ins.op {
        Opcode::TensorScalar => &[(ts::OP0, "op0"), (ts::OP1, "op1")],
        _ => return Ok(()),
    };
    for &(i, name) in ops {
        let Some(op) = alu(&ins.args, i) else {
            continue;
        };
        let allowed: &[Engine] = match op {
            AluOp::Rsqrt => &[Engine::Gpsimd, Engine::Scalar],
            AluOp::Reciprocal => &[Engine::Vector, Engine::Scalar],
            _ => continue,
        };
        if !allowed.contains(&ins.engine) {
            let names: Vec<_> = allowed.iter().map(|e| e.name()).collect();
            return Err(err(
                Value,
                format!(
                    "{} runs on {} only, not on {}",
                    op.name(),
                    names.join(" / "),
                    ins.engine.name()
                ),
            )
            .operand(name));
        }
    }
    Ok(())
}
