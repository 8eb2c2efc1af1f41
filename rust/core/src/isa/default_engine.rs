//! Which engine runs an instruction whose `engine` is unknown / not written (reference §2.2,
//! §2.6): a fact of the ISA about an instruction's operands, used by the text parser and the
//! assembler before the instruction is validated.

use super::instr::{Arg, Instr, Scalar};
use super::ops;
use super::tables::{AluOp, DType, Engine, Opcode};
use crate::memory::{Ap, Mem};

/// The engine an instruction runs on when none is given:
/// - `tensor_tensor`: `power` runs on GpSimd only; when every tensor operand is int32/uint32 and
///   none is in PSUM, GpSimd (exact integer math); otherwise VectorE.
/// - `tensor_scalar` with `rsqrt` (a GpSimd/ScalarE operator): GpSimd, or ScalarE when an operand
///   is in PSUM (GpSimd cannot reach PSUM).
/// - everything else (and operands the instruction's view does not accept): the first engine of
///   the instruction's ISA record.
pub fn default_engine(op: Opcode, args: &[Arg]) -> Engine {
    if !matches!(op, Opcode::TensorTensor | Opcode::TensorScalar) {
        return first_engine(op);
    }
    let ins = Instr {
        op,
        engine: first_engine(op),
        args: args.to_vec(),
        waits: Vec::new(),
        signals: Vec::new(),
        name: None,
    };
    default_engine_of(&ins)
}

/// `default_engine(ins.op, &ins.args)` without copying the operands (the assembler's case: the
/// instruction is at hand; its engine, waits, signals and name play no part).
pub fn default_engine_of(ins: &Instr) -> Engine {
    let first = first_engine(ins.op);
    if !matches!(ins.op, Opcode::TensorTensor | Opcode::TensorScalar) {
        return first;
    }
    by_operands(ins).unwrap_or(first)
}

/// The first engine of the instruction's ISA record.
fn first_engine(op: Opcode) -> Engine {
    op.spec()
        .engines
        .first()
        .copied()
        .unwrap_or(Engine::Unknown)
}

/// The operand-dependent choice; `None` keeps the first engine.
fn by_operands(ins: &Instr) -> Option<Engine> {
    match ins.op {
        Opcode::TensorTensor => {
            let v = ops::TensorTensor::view(ins).ok()?;
            if v.op == AluOp::Power {
                return Some(Engine::Gpsimd);
            }
            let aps = [v.dst, v.data1, v.data2];
            let all_int32 = aps
                .iter()
                .all(|ap| matches!(ap.dtype, DType::Int32 | DType::Uint32));
            (all_int32 && !any_psum(&aps)).then_some(Engine::Gpsimd)
        }
        Opcode::TensorScalar => {
            let v = ops::TensorScalar::view(ins).ok()?;
            if v.op0 != AluOp::Rsqrt && v.op1 != Some(AluOp::Rsqrt) {
                return None;
            }
            Some(if any_psum(&tensor_scalar_aps(&v)) {
                Engine::Scalar
            } else {
                Engine::Gpsimd
            })
        }
        _ => None,
    }
}

/// Whether any of `aps` is in PSUM (the engine choice rules send PSUM work to ScalarE).
pub(crate) fn any_psum(aps: &[&Ap]) -> bool {
    aps.iter().any(|ap| ap.mem == Mem::Psum)
}

/// Every tensor a `tensor_scalar` touches: dst, data and its (P, 1) tile operands.
pub(crate) fn tensor_scalar_aps<'a>(v: &ops::TensorScalar<'a>) -> Vec<&'a Ap> {
    let mut aps = vec![v.dst, v.data];
    aps.extend(
        [v.operand0, v.operand1]
            .into_iter()
            .flatten()
            .filter_map(Scalar::tile),
    );
    aps
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let ins = |dst: Mem, op0: AluOp| {
            crate::isa::text::parse_instr_unchecked(&format!(
                "tensor_scalar dst={} data={} op0={}",
                crate::isa::text::format_ap(f(dst).tensor().unwrap()),
                crate::isa::text::format_ap(f(Mem::Sbuf).tensor().unwrap()),
                op0.name()
            ))
            .unwrap()
        };
        assert_eq!(ins(Mem::Sbuf, AluOp::Rsqrt).engine, Engine::Gpsimd);
        assert_eq!(ins(Mem::Psum, AluOp::Rsqrt).engine, Engine::Scalar);
        assert_eq!(ins(Mem::Sbuf, AluOp::Add).engine, Engine::Vector);
    }
}
