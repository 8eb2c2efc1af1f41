//! Which engine runs an instruction whose `engine` is unknown / not written, and which ALU
//! operators each engine's `tensor_scalar` / `tensor_tensor` accepts (reference §2.2, §2.6).

use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::tables::p::{tensor_scalar as ts, tensor_tensor as tt};
use crate::isa::{AluOp, Arg, DType, Engine, Instr, Opcode};
use crate::memory::Mem;

fn alu(args: &[Arg], i: usize) -> Option<AluOp> {
    match args.get(i) {
        Some(Arg::Enum(v)) => AluOp::from_u8(*v),
        _ => None,
    }
}

fn tensors(args: &[Arg]) -> impl Iterator<Item = &crate::memory::Ap> {
    args.iter().filter_map(Arg::tensor)
}

fn any_psum(args: &[Arg]) -> bool {
    tensors(args).any(|ap| ap.mem == Mem::Psum)
}

/// The engine an instruction runs on when none is given:
/// - `tensor_tensor`: `power` runs on GpSimd only; when every tensor operand is int32/uint32 and
///   none is in PSUM, GpSimd (exact integer math); otherwise VectorE.
/// - `tensor_scalar` with `rsqrt` (a GpSimd/ScalarE operator): GpSimd, or ScalarE when an operand
///   is in PSUM (GpSimd cannot reach PSUM).
/// - everything else: the first engine of the instruction's ISA record.
pub fn default_engine(op: Opcode, args: &[Arg]) -> Engine {
    let first = op
        .spec()
        .engines
        .first()
        .copied()
        .unwrap_or(Engine::Unknown);
    match op {
        Opcode::TensorTensor => {
            if alu(args, tt::OP) == Some(AluOp::Power) {
                return Engine::Gpsimd;
            }
            let mut ts = tensors(args).peekable();
            let all_int32 = ts.peek().is_some()
                && ts.all(|ap| matches!(ap.dtype, DType::Int32 | DType::Uint32));
            if all_int32 && !any_psum(args) {
                Engine::Gpsimd
            } else {
                first
            }
        }
        Opcode::TensorScalar => {
            let rsqrt = [ts::OP0, ts::OP1]
                .iter()
                .any(|&i| alu(args, i) == Some(AluOp::Rsqrt));
            match (rsqrt, any_psum(args)) {
                (true, false) => Engine::Gpsimd,
                (true, true) => Engine::Scalar,
                _ => first,
            }
        }
        _ => first,
    }
}

/// Operators that exist only on some engines: `rsqrt` on GpSimd/ScalarE, `reciprocal` on
/// VectorE/ScalarE (reference §2.2).
pub fn check_engine_ops(ins: &Instr) -> Result<()> {
    if ins.op != Opcode::TensorScalar {
        return Ok(());
    }
    let v = crate::isa::ops::TensorScalar::view(ins)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Ap;

    fn tile(mem: Mem, dtype: DType) -> Arg {
        Arg::Tensor(Ap {
            mem,
            dtype,
            start: 0,
            parts: 16,
            pstep: 0,
            offset: 0,
            dims: vec![(1, 4)],
            dynamic: None,
        })
    }

    #[test]
    fn tensor_tensor_default_engine() {
        let add = Arg::Enum(AluOp::Add as u8);
        let i32s = |m: Mem| tile(m, DType::Int32);
        let args = vec![
            i32s(Mem::Sbuf),
            i32s(Mem::Sbuf),
            tile(Mem::Sbuf, DType::Uint32),
            add.clone(),
        ];
        assert_eq!(default_engine(Opcode::TensorTensor, &args), Engine::Gpsimd);
        let args = vec![
            i32s(Mem::Sbuf),
            i32s(Mem::Psum),
            i32s(Mem::Sbuf),
            add.clone(),
        ];
        assert_eq!(default_engine(Opcode::TensorTensor, &args), Engine::Vector);
        let args = vec![
            i32s(Mem::Sbuf),
            tile(Mem::Sbuf, DType::Float32),
            i32s(Mem::Sbuf),
            add,
        ];
        assert_eq!(default_engine(Opcode::TensorTensor, &args), Engine::Vector);
        let f = || tile(Mem::Sbuf, DType::Float32);
        let args = vec![f(), f(), f(), Arg::Enum(AluOp::Power as u8)];
        assert_eq!(default_engine(Opcode::TensorTensor, &args), Engine::Gpsimd);
    }

    #[test]
    fn rsqrt_default_engine() {
        let f = |m: Mem| tile(m, DType::Float32);
        let mut args = vec![Arg::Absent; 8];
        args[ts::DST] = f(Mem::Sbuf);
        args[ts::DATA] = f(Mem::Sbuf);
        args[ts::OP0] = Arg::Enum(AluOp::Rsqrt as u8);
        assert_eq!(default_engine(Opcode::TensorScalar, &args), Engine::Gpsimd);
        args[ts::DST] = f(Mem::Psum);
        assert_eq!(default_engine(Opcode::TensorScalar, &args), Engine::Scalar);
        args[ts::OP0] = Arg::Enum(AluOp::Add as u8);
        assert_eq!(default_engine(Opcode::TensorScalar, &args), Engine::Vector);
    }
}
