//! Which ALU operators each engine's `tensor_scalar` / `tensor_tensor` accepts (reference §2.2,
//! §2.6). The default-engine rule is an ISA fact (`isa::default_engine`), re-exported here.

use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops::TensorScalar;
use crate::isa::{AluOp, Engine};

pub use crate::isa::default_engine::default_engine;

/// Operators that exist only on some engines: `rsqrt` on GpSimd/ScalarE, `reciprocal` on
/// VectorE/ScalarE (reference §2.2).
pub fn check_engine_ops(v: &TensorScalar) -> Result<()> {
    let ins = v.ins;
    for (op, name) in [(Some(v.op0), "op0"), (v.op1, "op1")] {
        let Some(op) = op else {
            continue;
        };
        let allowed: &[Engine] = match op {
            AluOp::Rsqrt => &[Engine::Gpsimd, Engine::Scalar],
            AluOp::Reciprocal => &[Engine::Vector, Engine::Scalar],
            _ => continue,
        };
        if !allowed.contains(&ins.engine) {
            let names: Vec<_> = allowed.iter().map(|e| e.name()).collect();
            return Err(fail(
                Value,
                "alu_op_engine",
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
