//! Per-stream control flow: `branch` targets are instruction indices of the core program that
//! must belong to the branching engine's own stream; a taken branch moves that stream's cursor.

use super::Stream;
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::ops;
use crate::isa::text::format_instr;
use crate::isa::{Opcode, Program};

/// Every branch targets an instruction of its own engine stream, or the program's end.
pub fn check_branches(p: &Program) -> Result<()> {
    for (i, ins) in p.instrs.iter().enumerate() {
        if ins.op != Opcode::Branch {
            continue;
        }
        let t = ops::Branch::view(ins)?.target;
        let ok = match usize::try_from(t) {
            Ok(t) if t == p.instrs.len() => true,
            Ok(t) => p
                .instrs
                .get(t)
                .is_some_and(|x| Stream::of(x.engine) == Stream::of(ins.engine)),
            Err(_) => false,
        };
        if !ok {
            return Err(fail(
                Value,
                "branch_target_outside_stream",
                format!(
                    "branch target {t} must be an instruction of the {} stream (0..{}) or the program end {}",
                    ins.engine.name(),
                    p.instrs.len(),
                    p.instrs.len()
                ),
            )
            .operand("target")
            .at(i, format!("{} (core {})", format_instr(ins), p.core)));
        }
    }
    Ok(())
}

/// Move a stream's cursor to instruction `target` (validated by `check_branches`); a target
/// that is not in the stream (the program end) ends the stream.
pub fn jump(list: &[u32], pos: &mut usize, target: u32) {
    *pos = list.binary_search(&target).unwrap_or(list.len());
}

/// True when the program has runtime control flow.
pub fn has_branches(p: &Program) -> bool {
    p.instrs.iter().any(|i| i.op == Opcode::Branch)
}
