//! Read-after-write between consecutive instructions of one engine stream, for the cost
//! model's dependent-instruction overhead (`cost::DEPENDENT_CYCLES`, docs/cost-model.md): an
//! instruction that reads what the previous instruction of its engine wrote cannot start
//! reading until that write has committed. Tracked with on-chip bounding boxes (partitions x
//! bytes per partition), which may over-report a dependency for interleaved strided operands.

use crate::isa::spec::DataPath;
use crate::isa::{Engine, Instr};
use crate::memory::{Ap, Mem};

/// The on-chip bytes one operand touches: memory, partitions `p0..p1`, bytes `lo..hi` of
/// each partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OnChipBox {
    mem: Mem,
    p0: u32,
    p1: u32,
    lo: i128,
    hi: i128,
}

impl OnChipBox {
    #[inline]
    fn of(a: &Ap) -> Option<OnChipBox> {
        if a.mem == Mem::Hbm {
            return None;
        }
        let span = |a: &Ap| {
            let (lo, hi) = a.row_byte_range();
            (a.offset as i128 + lo, a.offset as i128 + hi)
        };
        let (lo, hi) = match a.dynamic.as_deref() {
            // A runtime offset may take any index in 0..bound: the box of both ends.
            Some(d) => match (a.at_index(0), a.at_index(d.bound as i64 - 1)) {
                (Ok(x), Ok(y)) => {
                    let ((l0, h0), (l1, h1)) = (span(&x), span(&y));
                    (l0.min(l1), h0.max(h1))
                }
                _ => (i128::MIN, i128::MAX),
            },
            None => span(a),
        };
        Some(OnChipBox {
            mem: a.mem,
            p0: a.start,
            p1: a.start + a.parts,
            lo,
            hi,
        })
    }

    #[inline]
    fn overlaps(&self, o: &OnChipBox) -> bool {
        self.mem == o.mem && self.p0 < o.p1 && o.p0 < self.p1 && self.lo < o.hi && o.lo < self.hi
    }
}

/// What the previous instruction of a stream wrote on chip (up to two operands are kept; an
/// instruction writing more is rare and the rest are ignored).
#[derive(Clone, Copy, Debug, Default)]
pub struct LastWrites {
    boxes: [Option<OnChipBox>; 2],
}

/// The streaming engines the dependent-instruction overhead applies to (their compute
/// instructions: a DMA trigger's transfer is asynchronous, a control instruction writes no tile).
fn tracked(e: Engine) -> bool {
    matches!(e, Engine::Vector | Engine::Scalar | Engine::Gpsimd)
}

impl LastWrites {
    /// Whether `ins` reads what the previous instruction wrote; then remember `ins`'s writes.
    #[inline]
    pub fn track(&mut self, ins: &Instr) -> bool {
        if !tracked(ins.engine) || ins.op.spec().cost.path() != DataPath::Compute {
            self.boxes = [None, None];
            return false;
        }
        let mut dependent = false;
        let mut next = [None, None];
        let mut k = 0;
        let params = ins.op.spec().params;
        for (i, arg) in ins.args.iter().enumerate() {
            let Some(ap) = arg.tensor() else { continue };
            let Some(b) = OnChipBox::of(ap) else { continue };
            let acc = params[i].access;
            if !dependent && acc.reads() {
                dependent = self.boxes.iter().flatten().any(|w| w.overlaps(&b));
            }
            if k < 2 && acc.writes() {
                next[k] = Some(b);
                k += 1;
            }
        }
        self.boxes = next;
        dependent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::text::parse_instr_unchecked;

    #[test]
    fn a_read_of_the_last_write_is_dependent() {
        let a = parse_instr_unchecked("activation.scalar dst=sbuf:float32[0:1]+0[[1,1]] data=sbuf:float32[0:1]+64[[1,1]] op=exp").unwrap();
        let b = parse_instr_unchecked("activation.scalar dst=sbuf:float32[0:1]+64[[1,1]] data=sbuf:float32[0:1]+0[[1,1]] op=exp").unwrap();
        let c = parse_instr_unchecked("activation.scalar dst=sbuf:float32[0:1]+128[[1,1]] data=sbuf:float32[0:1]+256[[1,1]] op=exp").unwrap();
        let mut w = LastWrites::default();
        assert!(!w.track(&a));
        assert!(w.track(&b));
        assert!(!w.track(&c));
    }
}
